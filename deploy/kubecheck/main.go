// kubecheck decodes Kubernetes manifests strictly into their API types
// (k8s.io/api, the same Go types the API server decodes into), offline:
// an unknown or misspelt field, a duplicate field, a value of the wrong
// type or a kind this Kubernetes version does not know is an error naming
// the file, the object and the field. Object names are checked as the API
// server checks them.
//
// It is what deploy/'s manifests are schema-checked with: kubeconform and
// similar tools download their JSON schemas at run time, which the
// machines this project is tested on cannot reach.
//
//	kubecheck FILE...     ("-" reads standard input)
package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"k8s.io/apimachinery/pkg/api/validation"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/yaml"
)

// volumeSnapshotClass mirrors snapshot.storage.k8s.io/v1 VolumeSnapshotClass
// (kubernetes-csi/external-snapshotter, client/apis/volumesnapshot/v1):
// a CRD, not in k8s.io/api.
type volumeSnapshotClass struct {
	APIVersion     string            `json:"apiVersion"`
	Kind           string            `json:"kind"`
	Metadata       json.RawMessage   `json:"metadata"`
	Driver         string            `json:"driver"`
	Parameters     map[string]string `json:"parameters,omitempty"`
	DeletionPolicy string            `json:"deletionPolicy"`
}

type header struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name      string `json:"name"`
		Namespace string `json:"namespace"`
	} `json:"metadata"`
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: kubecheck FILE... (- for standard input)")
		os.Exit(2)
	}
	decoder := serializer.NewCodecFactory(scheme.Scheme, serializer.EnableStrict).UniversalDeserializer()
	objects, failures := 0, 0
	for _, file := range os.Args[1:] {
		documents, err := read(file)
		if err != nil {
			fmt.Fprintf(os.Stderr, "%s: %v\n", file, err)
			failures++
			continue
		}
		for index, document := range documents {
			what, err := check(decoder, document)
			if what == "" && err == nil {
				continue // an empty document (comments only)
			}
			objects++
			if err != nil {
				fmt.Fprintf(os.Stderr, "%s: document %d (%s): %v\n", file, index, what, err)
				failures++
			}
		}
	}
	if failures > 0 {
		fmt.Fprintf(os.Stderr, "kubecheck: %d of %d objects failed\n", failures, objects)
		os.Exit(1)
	}
	fmt.Printf("kubecheck: %d objects valid\n", objects)
}

func read(file string) ([][]byte, error) {
	var input io.Reader = os.Stdin
	if file != "-" {
		opened, err := os.Open(file)
		if err != nil {
			return nil, err
		}
		defer opened.Close()
		input = opened
	}
	reader := utilyaml.NewYAMLReader(bufio.NewReader(input))
	var documents [][]byte
	for {
		document, err := reader.Read()
		if errors.Is(err, io.EOF) {
			return documents, nil
		}
		if err != nil {
			return nil, err
		}
		documents = append(documents, document)
	}
}

// check returns "Kind/name" of the document (empty for an empty one) and
// what is wrong with it.
func check(decoder runtime.Decoder, document []byte) (string, error) {
	asJSON, err := yaml.YAMLToJSON(document)
	if err != nil {
		return "?", fmt.Errorf("not YAML: %w", err)
	}
	if bytes.Equal(bytes.TrimSpace(asJSON), []byte("null")) {
		return "", nil
	}
	var head header
	if err := json.Unmarshal(asJSON, &head); err != nil {
		return "?", fmt.Errorf("not an object: %w", err)
	}
	what := head.Kind + "/" + head.Metadata.Name
	for _, problem := range validation.NameIsDNSSubdomain(head.Metadata.Name, false) {
		return what, fmt.Errorf("metadata.name %q: %s", head.Metadata.Name, problem)
	}
	if head.APIVersion == "snapshot.storage.k8s.io/v1" && head.Kind == "VolumeSnapshotClass" {
		strict := json.NewDecoder(bytes.NewReader(asJSON))
		strict.DisallowUnknownFields()
		var class volumeSnapshotClass
		if err := strict.Decode(&class); err != nil {
			return what, err
		}
		if class.Driver == "" || (class.DeletionPolicy != "Delete" && class.DeletionPolicy != "Retain") {
			return what, fmt.Errorf("driver and deletionPolicy (Delete or Retain) are required")
		}
		return what, nil
	}
	if _, _, err := decoder.Decode(asJSON, nil, nil); err != nil {
		return what, errors.New(strings.TrimSpace(err.Error()))
	}
	return what, nil
}
