//! The Kubernetes deployment of the CSI driver (deploy/), checked offline:
//! no cluster exists on the machine that runs this. The real `helm` lints
//! and renders the chart (deploy/helm/trireme-csi); the plain YAML of
//! deploy/kubernetes/ must be exactly what deploy/render.sh makes of the
//! chart; and every rendered object, plain and from the chart under several
//! value sets, is checked against the contract with the driver (crates/csi):
//! the driver name, the flags given to `trireme-csi` and what backs each
//! (socket dirs, the token Secret, the API ConfigMap, the downward API, host
//! paths), pinned images, every standard sidecar, and RBAC rules covering
//! what each sidecar's own deploy/kubernetes/rbac.yaml asks for at the
//! pinned release.
//!
//! Every object is also decoded strictly into its Kubernetes API type by
//! deploy/kubecheck (a small Go program over k8s.io/api, built here with
//! `go build`): a misspelt field or a value of the wrong type fails.
//!
//! helm comes from `go install helm.sh/helm/v3/cmd/helm@VERSION` (.ci/run).

mod common;

use common::*;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

const ROOT_OF_REPO: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
const CHART: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../deploy/helm/trireme-csi");
const PLAIN_FILES: &[&str] = &["trireme-csi.yaml", "storageclasses.yaml", "secret.yaml"];

const DRIVER_NAME: &str = "csi.trireme.io";
/// The flags `trireme-csi` takes (the contract with crates/csi; each also
/// from an environment variable).
const DRIVER_FLAGS: &[&str] = &[
    "--endpoint",
    "--mode",
    "--node-name",
    "--api",
    "--token-file",
    "--nbd-socket",
    "--state-dir",
];
/// A go-installed helm assumes Kubernetes 1.20; the chart needs 1.28 or newer.
const KUBE_VERSION: &str = "1.34.0";
/// The StorageClass parameters the driver understands.
const STORAGE_CLASS_PARAMETERS: &[&str] = &[
    "resourceGroup",
    "replicas",
    "deviceClass",
    "csi.storage.k8s.io/fstype",
];
const SIDECAR_REGISTRY: &str = "registry.k8s.io/sig-storage/";
const HELM_TIMEOUT: Duration = Duration::from_secs(60);

/// One RBAC rule a sidecar needs: API group, resources, verbs.
type Rule = (
    &'static str,
    &'static [&'static str],
    &'static [&'static str],
);

/// A standard sidecar: its container, its image at the pinned tag, and the
/// rules its own deploy/kubernetes/rbac.yaml grants at that tag (cluster-wide
/// ones, then those of its namespace). Transcribed from the upstream file at
/// that tag: when a tag changes, the test fails until the rules are read
/// again.
struct Sidecar {
    container: &'static str,
    image: &'static str,
    tag: &'static str,
    cluster_rules: &'static [Rule],
    namespace_rules: &'static [Rule],
}

const LEASES: Rule = (
    "coordination.k8s.io",
    &["leases"],
    &["get", "watch", "list", "delete", "update", "create"],
);
const EVENTS: Rule = (
    "",
    &["events"],
    &["list", "watch", "create", "update", "patch"],
);

/// kubernetes-csi/external-provisioner v6.3.0, deploy/kubernetes/rbac.yaml.
const PROVISIONER: Sidecar = Sidecar {
    container: "csi-provisioner",
    image: "csi-provisioner",
    tag: "v6.3.0",
    cluster_rules: &[
        (
            "",
            &["persistentvolumes"],
            &["get", "list", "watch", "create", "patch", "delete"],
        ),
        (
            "",
            &["persistentvolumeclaims"],
            &["get", "list", "watch", "update"],
        ),
        (
            "storage.k8s.io",
            &["storageclasses"],
            &["get", "list", "watch"],
        ),
        EVENTS,
        (
            "snapshot.storage.k8s.io",
            &["volumesnapshots"],
            &["get", "list", "watch", "update"],
        ),
        (
            "snapshot.storage.k8s.io",
            &["volumesnapshotcontents"],
            &["get", "list"],
        ),
        ("storage.k8s.io", &["csinodes"], &["get", "list", "watch"]),
        ("", &["nodes"], &["get", "list", "watch"]),
        (
            "storage.k8s.io",
            &["volumeattachments"],
            &["get", "list", "watch"],
        ),
    ],
    namespace_rules: &[
        LEASES,
        (
            "storage.k8s.io",
            &["csistoragecapacities"],
            &[
                "get", "list", "watch", "create", "update", "patch", "delete",
            ],
        ),
        ("", &["pods"], &["get"]),
        ("apps", &["replicasets"], &["get"]),
    ],
};

/// kubernetes-csi/external-attacher v4.12.0, deploy/kubernetes/rbac.yaml.
const ATTACHER: Sidecar = Sidecar {
    container: "csi-attacher",
    image: "csi-attacher",
    tag: "v4.12.0",
    cluster_rules: &[
        (
            "",
            &["persistentvolumes"],
            &["get", "list", "watch", "patch"],
        ),
        ("storage.k8s.io", &["csinodes"], &["get", "list", "watch"]),
        (
            "storage.k8s.io",
            &["volumeattachments"],
            &["get", "list", "watch", "patch"],
        ),
        ("storage.k8s.io", &["volumeattachments/status"], &["patch"]),
    ],
    namespace_rules: &[LEASES],
};

/// kubernetes-csi/external-snapshotter v8.6.0,
/// deploy/kubernetes/csi-snapshotter/rbac-csi-snapshotter.yaml.
const SNAPSHOTTER: Sidecar = Sidecar {
    container: "csi-snapshotter",
    image: "csi-snapshotter",
    tag: "v8.6.0",
    cluster_rules: &[
        EVENTS,
        (
            "snapshot.storage.k8s.io",
            &["volumesnapshotclasses"],
            &["get", "list", "watch"],
        ),
        (
            "snapshot.storage.k8s.io",
            &["volumesnapshotcontents"],
            &["get", "list", "watch", "update", "patch"],
        ),
        (
            "snapshot.storage.k8s.io",
            &["volumesnapshotcontents/status"],
            &["update", "patch"],
        ),
        (
            "groupsnapshot.storage.k8s.io",
            &["volumegroupsnapshotclasses"],
            &["get", "list", "watch"],
        ),
        (
            "groupsnapshot.storage.k8s.io",
            &["volumegroupsnapshotcontents"],
            &["get", "list", "watch", "update", "patch"],
        ),
        (
            "groupsnapshot.storage.k8s.io",
            &["volumegroupsnapshotcontents/status"],
            &["update", "patch"],
        ),
    ],
    namespace_rules: &[LEASES],
};

/// kubernetes-csi/external-resizer v2.2.1, deploy/kubernetes/rbac.yaml.
const RESIZER: Sidecar = Sidecar {
    container: "csi-resizer",
    image: "csi-resizer",
    tag: "v2.2.1",
    cluster_rules: &[
        (
            "",
            &["persistentvolumes"],
            &["get", "list", "watch", "patch"],
        ),
        ("", &["persistentvolumeclaims"], &["get", "list", "watch"]),
        ("", &["pods"], &["get", "list", "watch"]),
        ("", &["persistentvolumeclaims/status"], &["patch"]),
        EVENTS,
        (
            "storage.k8s.io",
            &["volumeattributesclasses"],
            &["get", "list", "watch"],
        ),
    ],
    namespace_rules: &[LEASES],
};

/// kubernetes-csi/livenessprobe v2.19.0: no Kubernetes API access.
const LIVENESS_PROBE: Sidecar = Sidecar {
    container: "liveness-probe",
    image: "livenessprobe",
    tag: "v2.19.0",
    cluster_rules: &[],
    namespace_rules: &[],
};

/// kubernetes-csi/node-driver-registrar v2.17.0: talks to the kubelet's
/// registration socket only (its README: no RBAC needed).
const REGISTRAR: Sidecar = Sidecar {
    container: "node-driver-registrar",
    image: "csi-node-driver-registrar",
    tag: "v2.17.0",
    cluster_rules: &[],
    namespace_rules: &[],
};

const CONTROLLER_SIDECARS: &[&Sidecar] = &[
    &PROVISIONER,
    &ATTACHER,
    &SNAPSHOTTER,
    &RESIZER,
    &LIVENESS_PROBE,
];
const NODE_SIDECARS: &[&Sidecar] = &[&REGISTRAR, &LIVENESS_PROBE];

// ---------------------------------------------------------------- helm

/// The helm binary: on PATH, or where `go install` puts it.
fn helm() -> Option<PathBuf> {
    if have_tool("helm") {
        return Some(PathBuf::from("helm"));
    }
    let mut candidates = Vec::new();
    if let Some(gobin) = std::env::var_os("GOBIN") {
        candidates.push(PathBuf::from(gobin).join("helm"));
    }
    if let Some(gopath) = std::env::var_os("GOPATH") {
        candidates.push(PathBuf::from(gopath).join("bin/helm"));
    }
    if let Some(home) = std::env::var_os("HOME") {
        candidates.push(PathBuf::from(home).join("go/bin/helm"));
    }
    candidates.into_iter().find(|path| path.is_file())
}

fn helm_or_skip() -> Option<PathBuf> {
    let found = helm();
    if found.is_none() {
        skip("missing tool: helm (.ci/run installs it with go install helm.sh/helm/v3/cmd/helm)");
    }
    found
}

/// `helm template` of the chart as the plain files are rendered (release and
/// namespace trireme-csi), with `extra` arguments; the parsed objects.
fn render(helm: &Path, extra: &[&str]) -> Vec<Value> {
    let mut args = vec![
        "template",
        "trireme-csi",
        CHART,
        "--namespace",
        "trireme-csi",
        "--kube-version",
        KUBE_VERSION,
    ];
    args.extend_from_slice(extra);
    let text = run_t(&mut cmd(helm.to_str().unwrap(), &args), HELM_TIMEOUT);
    parse_yaml(&text, "helm template")
}

/// All documents of a multi-document YAML text, empty ones left out.
fn parse_yaml(text: &str, origin: &str) -> Vec<Value> {
    let mut objects = Vec::new();
    for (index, document) in serde_norway::Deserializer::from_str(text).enumerate() {
        let value: Value = serde::Deserialize::deserialize(document)
            .unwrap_or_else(|error| panic!("{origin}: document {index} is not YAML: {error}"));
        if !value.is_null() {
            objects.push(value);
        }
    }
    objects
}

fn plain_objects() -> Vec<Value> {
    let mut objects = Vec::new();
    for file in PLAIN_FILES {
        let path = Path::new(ROOT_OF_REPO).join("deploy/kubernetes").join(file);
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|error| panic!("cannot read {}: {error}", path.display()));
        objects.extend(parse_yaml(&text, &path.display().to_string()));
    }
    objects
}

/// deploy/kubecheck, built with the Go toolchain into the test's scratch dir.
fn kubecheck_or_skip() -> Option<PathBuf> {
    let go = if have_tool("go") {
        "go".to_string()
    } else if Path::new("/usr/local/go/bin/go").is_file() {
        "/usr/local/go/bin/go".to_string()
    } else {
        skip("missing tool: go (builds deploy/kubecheck)");
        return None;
    };
    let binary = Path::new(env!("CARGO_TARGET_TMPDIR")).join("kubecheck");
    let mut build = cmd(&go, &["build", "-o", binary.to_str().unwrap(), "."]);
    build.current_dir(Path::new(ROOT_OF_REPO).join("deploy/kubecheck"));
    // Modules come from the Go module proxy on a first build, then the cache.
    run_t(&mut build, Duration::from_secs(600));
    Some(binary)
}

/// Values unlike the defaults in every place a reference must follow:
/// another kubelet directory (microk8s), socket and state directories, an
/// existing Secret under another key, one API address, one controller,
/// an xfs class on nvme pools.
const CUSTOM_VALUES: &str = "\
trireme:
  api: [http://192.0.2.7:7450]
  nbdSocketDir: /run/trireme
  nbdSocketName: nbd.sock
token: {existingSecret: trireme-admin, key: admin-token, value: ''}
kubeletDir: /var/snap/microk8s/common/var/lib/kubelet
controller: {replicas: 1}
node: {stateDir: /srv/trireme-csi}
storageClasses:
  - {name: fast, fsType: xfs, deviceClass: nvme, replicas: 2, allowVolumeExpansion: true}
  - {name: fast-block, allowVolumeExpansion: true, resourceGroup: vms}
";

// ------------------------------------------------------------- the tests

#[test]
fn chart_lints_and_the_plain_yaml_is_what_it_renders() {
    let Some(helm) = helm_or_skip() else { return };
    let helm = helm.to_str().unwrap();
    // The chart's own required value (the token) given, as a user must.
    let lint = run_t(
        &mut cmd(
            helm,
            &[
                "lint",
                "--strict",
                CHART,
                "--kube-version",
                KUBE_VERSION,
                "--set",
                "token.value=t0ken",
            ],
        ),
        HELM_TIMEOUT,
    );
    assert!(lint.contains("0 chart(s) failed"), "helm lint: {lint}");

    let mut check = cmd(&format!("{ROOT_OF_REPO}/deploy/render.sh"), &["--check"]);
    check.env("HELM", helm);
    let out = exec(&mut check, HELM_TIMEOUT);
    assert!(
        out.success(),
        "deploy/kubernetes/ is not what the chart renders (run deploy/render.sh):\n{}",
        out.describe("deploy/render.sh --check")
    );
}

#[test]
fn every_manifest_follows_the_driver_contract() {
    let Some(helm) = helm_or_skip() else { return };
    let plain = plain_objects();
    check_contract(&plain, "deploy/kubernetes", Expect::default());
    // The plain secret.yaml is a template: its token a placeholder to replace.
    let secret = find(&plain, "Secret", "trireme-csi-token");
    assert_eq!(
        secret["stringData"]["token"], "PASTE-THE-ADMIN-TOKEN-HERE",
        "secret.yaml"
    );

    let rendered = render(&helm, &["--set", "token.value=t0ken"]);
    check_contract(&rendered, "helm template (defaults)", Expect::default());

    // Every reference moves along with the values (CUSTOM_VALUES).
    let tmp = TempDir::new("deploy-values");
    let values = tmp.path().join("values.yaml");
    std::fs::write(&values, CUSTOM_VALUES).unwrap();
    let custom = render(&helm, &["--values", values.to_str().unwrap()]);
    assert!(
        objects_of(&custom, "Secret").is_empty(),
        "an existing Secret named: the chart must not make one"
    );
    check_contract(
        &custom,
        "helm template (custom values)",
        Expect {
            kubelet_dir: "/var/snap/microk8s/common/var/lib/kubelet",
            nbd_socket: "/run/trireme/nbd.sock",
            state_dir: "/srv/trireme-csi",
            token_secret: "trireme-admin",
            token_key: "admin-token",
            api: "http://192.0.2.7:7450",
        },
    );
    let fast = find(&custom, "StorageClass", "fast");
    assert_eq!(fast["parameters"]["csi.storage.k8s.io/fstype"], "xfs");
    assert_eq!(fast["parameters"]["deviceClass"], "nvme");
    assert_eq!(fast["parameters"]["replicas"], "2");
    let fast_block = find(&custom, "StorageClass", "fast-block");
    assert_eq!(fast_block["parameters"]["resourceGroup"], "vms");
}

#[test]
fn values_that_cannot_work_are_refused_naming_the_value() {
    let Some(helm) = helm_or_skip() else { return };
    let helm = helm.to_str().unwrap();
    let cases: &[(&[&str], &str)] = &[
        (&[], "token.value"),
        (
            &["--set", "token.value=t", "--set", "image.tag=latest"],
            "tag",
        ),
        (
            &[
                "--set",
                "token.value=t",
                "--set",
                "sidecars.attacher.tag=latest",
            ],
            "tag",
        ),
        (
            &["--set", "token.value=t", "--set", "trireme.api=null"],
            "api",
        ),
        (
            &[
                "--set",
                "token.value=t",
                "--set",
                "trireme.api={10.0.0.1:7450}",
            ],
            "api",
        ),
        (
            &[
                "--set",
                "token.value=t",
                "--set",
                "storageClasses[0].name=x,storageClasses[0].fsType=btrfs",
            ],
            "fsType",
        ),
    ];
    for (values, named) in cases {
        let mut args = vec![
            "template",
            "trireme-csi",
            CHART,
            "--kube-version",
            KUBE_VERSION,
        ];
        args.extend_from_slice(values);
        let out = exec(&mut cmd(helm, &args), HELM_TIMEOUT);
        assert!(
            !out.success(),
            "helm template accepted {values:?}:\n{}",
            out.stdout
        );
        assert!(
            out.stderr.contains(named),
            "helm template {values:?} failed without naming '{named}': {}",
            out.stderr
        );
    }
}

#[test]
fn every_manifest_decodes_strictly_into_its_kubernetes_type() {
    let Some(helm) = helm_or_skip() else { return };
    let Some(kubecheck) = kubecheck_or_skip() else {
        return;
    };
    let kubecheck = kubecheck.to_str().unwrap();
    let plain: Vec<String> = PLAIN_FILES
        .iter()
        .map(|file| format!("{ROOT_OF_REPO}/deploy/kubernetes/{file}"))
        .collect();
    let checked = run(&mut cmd(kubecheck, &plain));
    assert!(checked.contains("objects valid"), "{checked}");

    let tmp = TempDir::new("kubecheck");
    let rendered = tmp.path().join("rendered.yaml");
    let text = run_t(
        &mut cmd(
            helm.to_str().unwrap(),
            &[
                "template",
                "trireme-csi",
                CHART,
                "--kube-version",
                KUBE_VERSION,
                "--set",
                "token.existingSecret=x,controller.replicas=3,node.resources.limits.memory=256Mi",
            ],
        ),
        HELM_TIMEOUT,
    );
    std::fs::write(&rendered, &text).unwrap();
    run(&mut cmd(kubecheck, &[rendered.to_str().unwrap()]));

    // The checker fails where Kubernetes would: a misspelt field, a number
    // given as words.
    for (from, to, named) in [
        (
            "mountPropagation: Bidirectional",
            "mountPropogation: Bidirectional",
            "unknown field",
        ),
        ("replicas: 3", "replicas: three", "replicas"),
    ] {
        assert!(text.contains(from), "rendered chart lacks '{from}'");
        let broken = tmp.path().join("broken.yaml");
        std::fs::write(&broken, text.replacen(from, to, 1)).unwrap();
        let out = run_fail(&mut cmd(kubecheck, &[broken.to_str().unwrap()]));
        assert!(
            out.stderr.contains(named),
            "kubecheck on '{to}': {}",
            out.stderr
        );
    }
}

/// Once the driver's crate is in the tree and its binary built, the flags
/// the manifests give must be ones it takes.
#[test]
fn driver_binary_takes_the_flags_the_manifests_give() {
    let crate_dir = Path::new(ROOT_OF_REPO).join("crates/csi");
    if !crate_dir.join("Cargo.toml").is_file() {
        eprintln!(
            "crates/csi is not in this tree: only the manifests' side of the contract is checked"
        );
        return;
    }
    // target/<profile>/deps/<this test> -> target/<profile>/trireme-csi
    let binary = std::env::current_exe()
        .unwrap()
        .parent()
        .and_then(Path::parent)
        .map(|profile| profile.join("trireme-csi"))
        .unwrap();
    if !binary.is_file() {
        skip(&format!(
            "{} is not built (cargo build --bin trireme-csi)",
            binary.display()
        ));
        return;
    }
    let help = run(&mut cmd(binary.to_str().unwrap(), &["--help"]));
    for flag in DRIVER_FLAGS {
        assert!(
            help.contains(flag),
            "trireme-csi --help lacks {flag}:\n{help}"
        );
    }
    let plain = plain_objects();
    for kind in ["Deployment", "DaemonSet"] {
        for workload in objects_of(&plain, kind) {
            let driver = container(workload, "trireme-csi");
            for (flag, _) in flags(driver) {
                assert!(
                    help.contains(&flag),
                    "{kind} gives {flag}, which trireme-csi does not take"
                );
            }
        }
    }
}

// ------------------------------------------------------- the contract

/// What a rendering was asked for, where it differs between value sets.
struct Expect {
    kubelet_dir: &'static str,
    nbd_socket: &'static str,
    state_dir: &'static str,
    token_secret: &'static str,
    token_key: &'static str,
    api: &'static str,
}

impl Default for Expect {
    fn default() -> Expect {
        Expect {
            kubelet_dir: "/var/lib/kubelet",
            nbd_socket: "/var/lib/trireme/nbd.sock",
            state_dir: "/var/lib/trireme-csi",
            token_secret: "trireme-csi-token",
            token_key: "token",
            api: "http://10.0.0.1:7450,http://10.0.0.2:7450,http://10.0.0.3:7450",
        }
    }
}

fn check_contract(objects: &[Value], origin: &str, expect: Expect) {
    eprintln!("checking {} objects of {origin}", objects.len());
    check_names_are_unique(objects, origin);
    check_csi_driver(objects, origin);
    check_classes(objects, origin);
    let controller = single(objects, "Deployment", origin);
    let node = single(objects, "DaemonSet", origin);
    check_images(objects, origin);

    // The controller: the driver in controller mode and its sidecars on one socket.
    let driver = check_driver_container(objects, controller, "controller", &expect, origin);
    for node_flag in ["--node-name", "--nbd-socket", "--state-dir"] {
        assert!(
            flag(driver, node_flag).is_none(),
            "{origin}: the controller is given {node_flag}, a node plugin flag"
        );
    }
    check_sidecars(controller, CONTROLLER_SIDECARS, origin);
    let provisioner = container(controller, "csi-provisioner");
    assert_eq!(
        flag(provisioner, "--feature-gates").as_deref(),
        Some("Topology=true"),
        "{origin}: csi-provisioner needs topology"
    );
    let replicas = controller["spec"]["replicas"].as_u64().unwrap_or(1);
    for sidecar in [&PROVISIONER, &ATTACHER, &SNAPSHOTTER, &RESIZER] {
        let leader_election = flags(container(controller, sidecar.container))
            .iter()
            .any(|(name, value)| name == "--leader-election" && value != "false");
        assert!(
            leader_election || replicas == 1,
            "{origin}: {} replicas but {} without --leader-election",
            replicas,
            sidecar.container
        );
    }
    check_rbac(objects, controller, CONTROLLER_SIDECARS, origin);

    // The node plugin.
    let driver = check_driver_container(objects, node, "node", &expect, origin);
    check_node_plugin(node, driver, &expect, origin);
    check_sidecars(node, NODE_SIDECARS, origin);
    check_rbac(objects, node, NODE_SIDECARS, origin);

    // The token Secret, where the chart makes it.
    if let Some(secret) = objects_of(objects, "Secret").first() {
        assert_eq!(secret["metadata"]["name"], expect.token_secret, "{origin}");
        let data = secret
            .get("stringData")
            .or_else(|| secret.get("data"))
            .unwrap();
        assert!(
            data.get(expect.token_key).is_some(),
            "{origin}: the Secret has no key {}",
            expect.token_key
        );
    }
}

fn check_names_are_unique(objects: &[Value], origin: &str) {
    let mut seen = BTreeSet::new();
    for object in objects {
        let key = (
            string(object, "/kind"),
            string(object, "/metadata/namespace"),
            string(object, "/metadata/name"),
        );
        assert!(
            !key.2.is_empty(),
            "{origin}: an object without a name: {object}"
        );
        assert!(seen.insert(key.clone()), "{origin}: {key:?} twice");
    }
}

fn check_csi_driver(objects: &[Value], origin: &str) {
    let driver = single(objects, "CSIDriver", origin);
    assert_eq!(driver["apiVersion"], "storage.k8s.io/v1", "{origin}");
    assert_eq!(driver["metadata"]["name"], DRIVER_NAME, "{origin}");
    let spec = &driver["spec"];
    assert_eq!(spec["attachRequired"], true, "{origin}: attachRequired");
    assert_eq!(spec["podInfoOnMount"], false, "{origin}: podInfoOnMount");
    assert_eq!(
        spec["volumeLifecycleModes"],
        serde_json::json!(["Persistent"]),
        "{origin}: volumeLifecycleModes"
    );
    assert_eq!(spec["fsGroupPolicy"], "File", "{origin}: fsGroupPolicy");
}

fn check_classes(objects: &[Value], origin: &str) {
    let classes = objects_of(objects, "StorageClass");
    assert!(
        classes.len() >= 2,
        "{origin}: a filesystem and a block class"
    );
    let mut filesystem_classes = 0;
    for class in &classes {
        let name = string(class, "/metadata/name");
        assert_eq!(class["provisioner"], DRIVER_NAME, "{origin}: {name}");
        assert_eq!(class["allowVolumeExpansion"], true, "{origin}: {name}");
        let empty = serde_json::Map::new();
        let parameters = class["parameters"].as_object().unwrap_or(&empty);
        for (key, value) in parameters {
            assert!(
                STORAGE_CLASS_PARAMETERS.contains(&key.as_str()),
                "{origin}: StorageClass {name} has parameter {key}, which the driver does not take"
            );
            let value = value
                .as_str()
                .unwrap_or_else(|| panic!("{origin}: {name}: {key} is not a string"));
            match key.as_str() {
                "csi.storage.k8s.io/fstype" => {
                    filesystem_classes += 1;
                    assert!(
                        ["ext4", "xfs"].contains(&value),
                        "{origin}: {name}: {value}"
                    );
                }
                "deviceClass" => assert!(
                    ["nvme", "ssd", "hdd"].contains(&value),
                    "{origin}: {name}: deviceClass '{value}'"
                ),
                "replicas" => assert!(
                    value.parse::<u32>().is_ok_and(|count| count >= 1),
                    "{origin}: {name}: replicas '{value}'"
                ),
                _ => assert!(!value.is_empty(), "{origin}: {name}: {key} empty"),
            }
        }
    }
    assert!(filesystem_classes >= 1, "{origin}: no filesystem class");
    let snapshot_class = single(objects, "VolumeSnapshotClass", origin);
    assert_eq!(snapshot_class["apiVersion"], "snapshot.storage.k8s.io/v1");
    assert_eq!(snapshot_class["driver"], DRIVER_NAME, "{origin}");
}

/// Every container image pinned to a release; sidecars from the
/// kubernetes-csi registry at the tags their RBAC was read at.
fn check_images(objects: &[Value], origin: &str) {
    let sidecars: BTreeMap<&str, &Sidecar> = CONTROLLER_SIDECARS
        .iter()
        .chain(NODE_SIDECARS)
        .map(|sidecar| (sidecar.container, *sidecar))
        .collect();
    for workload in workloads(objects) {
        for container in containers(workload) {
            let name = string(container, "/name");
            let image = string(container, "/image");
            let (repository, tag) = image
                .rsplit_once(':')
                .filter(|(repository, _)| !repository.ends_with('/'))
                .unwrap_or_else(|| panic!("{origin}: {name}: image {image} has no tag"));
            assert!(
                !tag.is_empty() && tag != "latest" && tag != "canary",
                "{origin}: {name}: image {image} is not pinned"
            );
            if let Some(sidecar) = sidecars.get(name.as_str()) {
                assert_eq!(
                    (repository, tag),
                    (
                        format!("{SIDECAR_REGISTRY}{}", sidecar.image).as_str(),
                        sidecar.tag
                    ),
                    "{origin}: {name}: another image or tag than the one whose RBAC this test knows"
                );
            } else {
                assert_eq!(name, "trireme-csi", "{origin}: unknown container {name}");
            }
        }
    }
}

/// The trireme-csi container of a workload: only contract flags, each
/// backed by what it names. Returns the container.
fn check_driver_container<'a>(
    objects: &[Value],
    workload: &'a Value,
    mode: &str,
    expect: &Expect,
    origin: &str,
) -> &'a Value {
    let origin = format!("{origin}: {}", string(workload, "/metadata/name"));
    let driver = container(workload, "trireme-csi");
    let given = flags(driver);
    for (name, _) in &given {
        assert!(
            DRIVER_FLAGS.contains(&name.as_str()),
            "{origin}: trireme-csi is given {name}, not a flag of the driver"
        );
    }
    let names: Vec<&str> = given.iter().map(|(name, _)| name.as_str()).collect();
    let unique: BTreeSet<&str> = names.iter().copied().collect();
    assert_eq!(
        unique.len(),
        names.len(),
        "{origin}: a flag given twice: {names:?}"
    );
    assert_eq!(flag(driver, "--mode").as_deref(), Some(mode), "{origin}");

    let endpoint = flag(driver, "--endpoint").expect("--endpoint");
    let socket = endpoint
        .strip_prefix("unix://")
        .unwrap_or_else(|| panic!("{origin}: --endpoint {endpoint} is not unix://"));
    assert!(
        mount_for(driver, socket).is_some(),
        "{origin}: the CSI socket {socket} is in no mounted volume"
    );

    let api = resolve(objects, driver, &flag(driver, "--api").expect("--api"));
    assert_eq!(api, expect.api, "{origin}: --api");
    for address in api.split(',') {
        assert!(
            address.starts_with("http://") || address.starts_with("https://"),
            "{origin}: --api address {address}"
        );
    }

    let token_file = flag(driver, "--token-file").expect("--token-file");
    let (volume, relative) = mount_for(driver, &token_file)
        .unwrap_or_else(|| panic!("{origin}: --token-file {token_file} is in no mounted volume"));
    let secret = &volume_named(workload, &volume)["secret"];
    assert_eq!(
        secret["secretName"], expect.token_secret,
        "{origin}: token Secret"
    );
    let items = secret["items"].as_array().cloned().unwrap_or_default();
    let path_of_key = items
        .iter()
        .find(|item| item["key"] == expect.token_key)
        .map(|item| string(item, "/path"))
        .unwrap_or_else(|| expect.token_key.to_string());
    assert_eq!(
        relative, path_of_key,
        "{origin}: --token-file is not the Secret's key"
    );
    driver
}

fn check_node_plugin(node: &Value, driver: &Value, expect: &Expect, origin: &str) {
    let origin = format!("{origin}: {}", string(node, "/metadata/name"));
    assert_eq!(
        driver["securityContext"]["privileged"], true,
        "{origin}: the node plugin must be privileged"
    );
    // --node-name from the downward API's spec.nodeName.
    let node_name = flag(driver, "--node-name").expect("--node-name");
    let variable = node_name
        .strip_prefix("$(")
        .and_then(|rest| rest.strip_suffix(')'))
        .unwrap_or_else(|| panic!("{origin}: --node-name {node_name} is not $(VARIABLE)"));
    let env = env_named(driver, variable)
        .unwrap_or_else(|| panic!("{origin}: no env {variable} for --node-name"));
    assert_eq!(
        env["valueFrom"]["fieldRef"]["fieldPath"], "spec.nodeName",
        "{origin}: {variable}"
    );

    // The node daemon's NBD socket, through a hostPath of its directory
    // (a directory, so a restarted daemon's new socket is seen).
    let nbd_socket = flag(driver, "--nbd-socket").expect("--nbd-socket");
    assert_eq!(nbd_socket, expect.nbd_socket, "{origin}");
    let (volume, relative) = mount_for(driver, &nbd_socket)
        .unwrap_or_else(|| panic!("{origin}: --nbd-socket {nbd_socket} is in no mounted volume"));
    let host = host_path(node, &volume)
        .unwrap_or_else(|| panic!("{origin}: {nbd_socket} is not on a hostPath volume"));
    assert_eq!(
        format!("{host}/{relative}"),
        expect.nbd_socket,
        "{origin}: the socket must be the host's"
    );

    // The state dir (nbdfuse mount points) on the host, its mounts seen there.
    let state_dir = flag(driver, "--state-dir").expect("--state-dir");
    assert_eq!(state_dir, expect.state_dir, "{origin}");
    let state = mount_at(driver, &state_dir)
        .unwrap_or_else(|| panic!("{origin}: --state-dir {state_dir} is not a mount"));
    assert_eq!(
        state["mountPropagation"], "Bidirectional",
        "{origin}: {state_dir}"
    );
    assert_eq!(
        host_path(node, &string(state, "/name")).as_deref(),
        Some(state_dir.as_str()),
        "{origin}: --state-dir must be the host's"
    );

    // /dev and the kubelet's directory, with mounts propagated back to the host.
    let dev = mount_for(driver, "/dev/loop-control").expect("/dev mounted");
    assert_eq!(host_path(node, &dev.0).as_deref(), Some("/dev"), "{origin}");
    let kubelet = mount_at(driver, expect.kubelet_dir)
        .unwrap_or_else(|| panic!("{origin}: {} not mounted", expect.kubelet_dir));
    assert_eq!(kubelet["mountPropagation"], "Bidirectional", "{origin}");
    assert_eq!(
        host_path(node, &string(kubelet, "/name")).as_deref(),
        Some(expect.kubelet_dir),
        "{origin}"
    );

    // The registrar tells the kubelet where the driver's socket is on the host.
    let registrar = container(node, "node-driver-registrar");
    let plugin_dir = format!("{}/plugins/{DRIVER_NAME}", expect.kubelet_dir);
    assert_eq!(
        flag(registrar, "--kubelet-registration-path"),
        Some(format!("{plugin_dir}/csi.sock")),
        "{origin}"
    );
    let endpoint = flag(driver, "--endpoint").unwrap();
    let (socket_volume, socket_file) =
        mount_for(driver, endpoint.strip_prefix("unix://").unwrap()).unwrap();
    assert_eq!(
        host_path(node, &socket_volume).map(|dir| format!("{dir}/{socket_file}")),
        Some(format!("{plugin_dir}/csi.sock")),
        "{origin}: the driver's socket is not where the registrar says"
    );
    let registration = mount_at(registrar, "/registration")
        .unwrap_or_else(|| panic!("{origin}: the registrar has no /registration"));
    assert_eq!(
        host_path(node, &string(registration, "/name")),
        Some(format!("{}/plugins_registry", expect.kubelet_dir)),
        "{origin}"
    );
}

/// Every sidecar present, talking to the driver's socket through the same
/// volume the driver serves it in.
fn check_sidecars(workload: &Value, sidecars: &[&Sidecar], origin: &str) {
    let driver = container(workload, "trireme-csi");
    let endpoint = flag(driver, "--endpoint").unwrap();
    let socket = endpoint.strip_prefix("unix://").unwrap();
    let (driver_volume, driver_file) = mount_for(driver, socket).unwrap();
    let present: BTreeSet<String> = containers(workload)
        .iter()
        .map(|container| string(container, "/name"))
        .collect();
    let expected: BTreeSet<String> = sidecars
        .iter()
        .map(|sidecar| sidecar.container.to_string())
        .chain(["trireme-csi".to_string()])
        .collect();
    assert_eq!(present, expected, "{origin}: containers");
    for sidecar in sidecars {
        let container = container(workload, sidecar.container);
        let address = flag(container, "--csi-address")
            .unwrap_or_else(|| panic!("{origin}: {} has no --csi-address", sidecar.container));
        let (volume, file) = mount_for(container, &address).unwrap_or_else(|| {
            panic!(
                "{origin}: {}'s --csi-address {address} is in no mounted volume",
                sidecar.container
            )
        });
        assert_eq!(
            (volume, file),
            (driver_volume.clone(), driver_file.clone()),
            "{origin}: {} does not reach the driver's socket",
            sidecar.container
        );
    }
}

/// The rules bound to the workload's service account cover what each of its
/// sidecars needs.
fn check_rbac(objects: &[Value], workload: &Value, sidecars: &[&Sidecar], origin: &str) {
    let namespace = string(workload, "/metadata/namespace");
    let account = string(workload, "/spec/template/spec/serviceAccountName");
    assert!(!account.is_empty(), "{origin}: no serviceAccountName");
    assert!(
        objects_of(objects, "ServiceAccount")
            .iter()
            .any(|sa| sa["metadata"]["name"] == account.as_str()
                && sa["metadata"]["namespace"] == namespace.as_str()),
        "{origin}: service account {account} is not defined"
    );
    let (cluster_rules, namespace_rules) = granted(objects, &namespace, &account);
    for sidecar in sidecars {
        for (needed, scope) in sidecar
            .cluster_rules
            .iter()
            .map(|rule| (rule, "cluster"))
            .chain(
                sidecar
                    .namespace_rules
                    .iter()
                    .map(|rule| (rule, "namespace")),
            )
        {
            let (group, resources, verbs) = needed;
            for resource in *resources {
                for verb in *verbs {
                    let covered = cluster_rules
                        .iter()
                        .chain(if scope == "namespace" {
                            &namespace_rules[..]
                        } else {
                            &[]
                        })
                        .any(|rule| allows(rule, group, resource, verb));
                    assert!(
                        covered,
                        "{origin}: {} needs {verb} on {group}/{resource} ({scope}), not granted to {namespace}/{account}",
                        sidecar.container
                    );
                }
            }
        }
    }
}

/// The rules granted to a service account: through ClusterRoleBindings
/// (everywhere) and RoleBindings in its namespace.
fn granted(objects: &[Value], namespace: &str, account: &str) -> (Vec<Value>, Vec<Value>) {
    let binds_account = |binding: &Value| {
        binding["subjects"].as_array().is_some_and(|subjects| {
            subjects.iter().any(|subject| {
                subject["kind"] == "ServiceAccount"
                    && subject["name"] == account
                    && subject["namespace"] == namespace
            })
        })
    };
    let rules_of = |kind: &str, name: &str, in_namespace: Option<&str>| -> Vec<Value> {
        objects_of(objects, kind)
            .into_iter()
            .filter(|role| {
                role["metadata"]["name"] == name
                    && in_namespace.is_none_or(|ns| role["metadata"]["namespace"] == ns)
            })
            .flat_map(|role| role["rules"].as_array().cloned().unwrap_or_default())
            .collect()
    };
    let mut cluster = Vec::new();
    for binding in objects_of(objects, "ClusterRoleBinding") {
        if binds_account(binding) {
            assert_eq!(binding["roleRef"]["kind"], "ClusterRole");
            cluster.extend(rules_of(
                "ClusterRole",
                &string(binding, "/roleRef/name"),
                None,
            ));
        }
    }
    let mut local = Vec::new();
    for binding in objects_of(objects, "RoleBinding") {
        if binds_account(binding) && binding["metadata"]["namespace"] == namespace {
            let role = string(binding, "/roleRef/name");
            match string(binding, "/roleRef/kind").as_str() {
                "Role" => local.extend(rules_of("Role", &role, Some(namespace))),
                _ => local.extend(rules_of("ClusterRole", &role, None)),
            }
        }
    }
    (cluster, local)
}

fn allows(rule: &Value, group: &str, resource: &str, verb: &str) -> bool {
    let has = |field: &str, wanted: &str| {
        rule[field]
            .as_array()
            .is_some_and(|list| list.iter().any(|item| item == wanted || item == "*"))
    };
    has("apiGroups", group) && has("resources", resource) && has("verbs", verb)
}

// ------------------------------------------------ reading the objects

fn string(value: &Value, pointer: &str) -> String {
    value
        .pointer(pointer)
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string()
}

fn objects_of<'a>(objects: &'a [Value], kind: &str) -> Vec<&'a Value> {
    objects
        .iter()
        .filter(|object| object["kind"] == kind)
        .collect()
}

fn single<'a>(objects: &'a [Value], kind: &str, origin: &str) -> &'a Value {
    let found = objects_of(objects, kind);
    assert_eq!(found.len(), 1, "{origin}: one {kind} expected");
    found[0]
}

fn find<'a>(objects: &'a [Value], kind: &str, name: &str) -> &'a Value {
    objects_of(objects, kind)
        .into_iter()
        .find(|object| object["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name}"))
}

fn workloads(objects: &[Value]) -> Vec<&Value> {
    objects
        .iter()
        .filter(|object| {
            ["Deployment", "DaemonSet", "StatefulSet", "Pod"]
                .contains(&object["kind"].as_str().unwrap_or(""))
        })
        .collect()
}

fn containers(workload: &Value) -> Vec<&Value> {
    workload["spec"]["template"]["spec"]["containers"]
        .as_array()
        .map(|list| list.iter().collect())
        .unwrap_or_default()
}

fn container<'a>(workload: &'a Value, name: &str) -> &'a Value {
    containers(workload)
        .into_iter()
        .find(|container| container["name"] == name)
        .unwrap_or_else(|| {
            panic!(
                "{} has no container {name}",
                string(workload, "/metadata/name")
            )
        })
}

/// A container's `--name=value` / `--name value` / `--name` arguments.
fn flags(container: &Value) -> Vec<(String, String)> {
    let arguments: Vec<String> = container["args"]
        .as_array()
        .map(|list| {
            list.iter()
                .map(|item| item.as_str().unwrap().to_string())
                .collect()
        })
        .unwrap_or_default();
    let mut parsed = Vec::new();
    let mut index = 0;
    while index < arguments.len() {
        let argument = &arguments[index];
        assert!(argument.starts_with("--"), "not a flag: {argument}");
        if let Some((name, value)) = argument.split_once('=') {
            parsed.push((name.to_string(), value.to_string()));
        } else if arguments
            .get(index + 1)
            .is_some_and(|next| !next.starts_with("--"))
        {
            parsed.push((argument.clone(), arguments[index + 1].clone()));
            index += 1;
        } else {
            parsed.push((argument.clone(), String::new()));
        }
        index += 1;
    }
    parsed
}

fn flag(container: &Value, name: &str) -> Option<String> {
    flags(container)
        .into_iter()
        .find(|(flag, _)| flag == name)
        .map(|(_, value)| value)
}

fn env_named<'a>(container: &'a Value, name: &str) -> Option<&'a Value> {
    container["env"]
        .as_array()?
        .iter()
        .find(|variable| variable["name"] == name)
}

/// A flag's value with `$(VARIABLE)` replaced as the kubelet does, from a
/// literal or a ConfigMap key.
fn resolve(objects: &[Value], container: &Value, value: &str) -> String {
    let Some(variable) = value
        .strip_prefix("$(")
        .and_then(|rest| rest.strip_suffix(')'))
    else {
        return value.to_string();
    };
    let env = env_named(container, variable)
        .unwrap_or_else(|| panic!("$({variable}) used but not in env"));
    if let Some(literal) = env["value"].as_str() {
        return literal.to_string();
    }
    let reference = &env["valueFrom"]["configMapKeyRef"];
    let map = find(objects, "ConfigMap", reference["name"].as_str().unwrap());
    map["data"][reference["key"].as_str().unwrap()]
        .as_str()
        .unwrap_or_else(|| panic!("ConfigMap has no key for $({variable})"))
        .to_string()
}

/// The volume mounted over `path` in a container (the deepest mount), and
/// the path below the mount point.
fn mount_for(container: &Value, path: &str) -> Option<(String, String)> {
    container["volumeMounts"]
        .as_array()?
        .iter()
        .filter_map(|mount| {
            let at = mount["mountPath"].as_str()?.trim_end_matches('/');
            let rest = path.strip_prefix(at)?.strip_prefix('/')?;
            Some((at.len(), string(mount, "/name"), rest.to_string()))
        })
        .max_by_key(|(depth, _, _)| *depth)
        .map(|(_, volume, rest)| (volume, rest))
}

fn mount_at<'a>(container: &'a Value, path: &str) -> Option<&'a Value> {
    container["volumeMounts"].as_array()?.iter().find(|mount| {
        mount["mountPath"]
            .as_str()
            .map(|at| at.trim_end_matches('/'))
            == Some(path)
    })
}

fn volume_named<'a>(workload: &'a Value, name: &str) -> &'a Value {
    workload["spec"]["template"]["spec"]["volumes"]
        .as_array()
        .and_then(|volumes| volumes.iter().find(|volume| volume["name"] == name))
        .unwrap_or_else(|| panic!("no volume {name}"))
}

fn host_path(workload: &Value, volume: &str) -> Option<String> {
    volume_named(workload, volume)["hostPath"]["path"]
        .as_str()
        .map(|path| path.trim_end_matches('/').to_string())
}
