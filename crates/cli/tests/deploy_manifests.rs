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
#[path = "deploy_manifests/contract.rs"]
mod contract;
#[path = "deploy_manifests/objects.rs"]
mod objects;
#[path = "deploy_manifests/sidecars.rs"]
mod sidecars;

use common::*;
use contract::*;
use objects::*;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::time::Duration;

const ROOT_OF_REPO: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
const CHART: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../deploy/helm/trireme-csi");
const PLAIN_FILES: &[&str] = &["trireme-csi.yaml", "storageclasses.yaml", "secret.yaml"];

/// A go-installed helm assumes Kubernetes 1.20; the chart needs 1.28 or newer.
const KUBE_VERSION: &str = "1.34.0";
/// What a cluster with the snapshot CRDs offers: the chart makes its
/// VolumeSnapshotClass only there.
const SNAPSHOT_CLASS_API: &str = "snapshot.storage.k8s.io/v1/VolumeSnapshotClass";
const HELM_TIMEOUT: Duration = Duration::from_secs(60);

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
        "--api-versions",
        SNAPSHOT_CLASS_API,
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
    let mut build = cmd(
        &go,
        &[
            "build",
            "-buildvcs=false",
            "-o",
            binary.to_str().unwrap(),
            ".",
        ],
    );
    build.current_dir(Path::new(ROOT_OF_REPO).join("deploy/kubecheck"));
    // Modules come from the Go module proxy on a first build, then the cache.
    run_t(&mut build, Duration::from_secs(600));
    Some(binary)
}

/// Values unlike the defaults in every place a reference must follow:
/// another kubelet directory (microk8s), an existing Secret under another key, one API address, one controller,
/// an xfs class on nvme pools.
const CUSTOM_VALUES: &str = "\
trireme:
  api: [http://192.0.2.7:7450]
token: {existingSecret: trireme-admin, key: admin-token, value: ''}
kubeletDir: /var/snap/microk8s/common/var/lib/kubelet
controller: {replicas: 1}
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

    // A cluster without the snapshot CRDs gets no VolumeSnapshotClass (it
    // would fail the whole install), the rest unchanged.
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
                "token.value=t0ken",
            ],
        ),
        HELM_TIMEOUT,
    );
    let without_crds = parse_yaml(&text, "helm template (no snapshot CRDs)");
    assert!(objects_of(&without_crds, "VolumeSnapshotClass").is_empty());
    assert_eq!(without_crds.len() + 1, rendered.len());

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
                "--api-versions",
                SNAPSHOT_CLASS_API,
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
