//! The contract between the manifests and the driver (crates/csi), and
//! what Kubernetes needs of a CSI deployment, checked on parsed objects.

use super::objects::*;
use super::sidecars::*;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};

pub const DRIVER_NAME: &str = "csi.trireme.io";
/// The flags `trireme-csi` takes (the contract with crates/csi; each also
/// from an environment variable).
pub const DRIVER_FLAGS: &[&str] = &[
    "--endpoint",
    "--mode",
    "--node-name",
    "--api",
    "--token-file",
];
/// The StorageClass parameters the driver understands.
pub const STORAGE_CLASS_PARAMETERS: &[&str] = &[
    "resourceGroup",
    "replicas",
    "deviceClass",
    "csi.storage.k8s.io/fstype",
];

/// What a rendering was asked for, where it differs between value sets.
pub struct Expect {
    pub kubelet_dir: &'static str,
    pub token_secret: &'static str,
    pub token_key: &'static str,
    pub api: &'static str,
}

impl Default for Expect {
    fn default() -> Expect {
        Expect {
            kubelet_dir: "/var/lib/kubelet",
            token_secret: "trireme-csi-token",
            token_key: "token",
            api: "http://10.0.0.1:7450,http://10.0.0.2:7450,http://10.0.0.3:7450",
        }
    }
}

pub fn check_contract(objects: &[Value], origin: &str, expect: Expect) {
    eprintln!("checking {} objects of {origin}", objects.len());
    check_names_are_unique(objects, origin);
    check_csi_driver(objects, origin);
    check_classes(objects, origin);
    let controller = single(objects, "Deployment", origin);
    let node = single(objects, "DaemonSet", origin);
    check_images(objects, origin);

    // The controller: the driver in controller mode and its sidecars on one socket.
    let driver = check_driver_container(objects, controller, "controller", &expect, origin);
    assert!(
        flag(driver, "--node-name").is_none(),
        "{origin}: the controller is given --node-name, a node plugin flag"
    );
    check_sidecars(controller, CONTROLLER_SIDECARS, origin);
    let provisioner = container(controller, "csi-provisioner");
    assert_eq!(
        flag(provisioner, "--feature-gates").as_deref(),
        Some("Topology=true"),
        "{origin}: csi-provisioner needs topology"
    );
    // Each node's segment names the node: a strict requisite would be one
    // node, where a volume of several replicas cannot be placed.
    assert!(
        flag(provisioner, "--strict-topology").is_none_or(|value| value == "false"),
        "{origin}: csi-provisioner with --strict-topology"
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

pub fn check_names_are_unique(objects: &[Value], origin: &str) {
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

pub fn check_csi_driver(objects: &[Value], origin: &str) {
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

pub fn check_classes(objects: &[Value], origin: &str) {
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
pub fn check_images(objects: &[Value], origin: &str) {
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
pub fn check_driver_container<'a>(
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

pub fn check_node_plugin(node: &Value, driver: &Value, expect: &Expect, origin: &str) {
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

    // The block devices are the node daemon's, on the host (it owns their
    // NBD bridge): the plugin needs no NBD socket and no state of its own.
    for gone in ["--nbd-socket", "--state-dir"] {
        assert!(flag(driver, gone).is_none(), "{origin}: {gone} is unused");
    }

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
pub fn check_sidecars(workload: &Value, sidecars: &[&Sidecar], origin: &str) {
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
pub fn check_rbac(objects: &[Value], workload: &Value, sidecars: &[&Sidecar], origin: &str) {
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
pub fn granted(objects: &[Value], namespace: &str, account: &str) -> (Vec<Value>, Vec<Value>) {
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

pub fn allows(rule: &Value, group: &str, resource: &str, verb: &str) -> bool {
    let has = |field: &str, wanted: &str| {
        rule[field]
            .as_array()
            .is_some_and(|list| list.iter().any(|item| item == wanted || item == "*"))
    };
    has("apiGroups", group) && has("resources", resource) && has("verbs", verb)
}
