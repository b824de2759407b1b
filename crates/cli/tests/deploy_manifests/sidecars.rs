//! The standard kubernetes-csi sidecars the deployment runs, each with the
//! RBAC rules its own deploy/kubernetes/rbac.yaml grants at the pinned
//! release, transcribed from that file at that tag: when a tag changes,
//! the test fails until the rules are read again.

pub const SIDECAR_REGISTRY: &str = "registry.k8s.io/sig-storage/";

/// One RBAC rule a sidecar needs: API group, resources, verbs.
pub type Rule = (
    &'static str,
    &'static [&'static str],
    &'static [&'static str],
);

/// A standard sidecar: its container, its image at the pinned tag, and the
/// rules its own deploy/kubernetes/rbac.yaml grants at that tag (cluster-wide
/// ones, then those of its namespace). Transcribed from the upstream file at
/// that tag: when a tag changes, the test fails until the rules are read
/// again.
pub struct Sidecar {
    pub container: &'static str,
    pub image: &'static str,
    pub tag: &'static str,
    pub cluster_rules: &'static [Rule],
    pub namespace_rules: &'static [Rule],
}

pub const LEASES: Rule = (
    "coordination.k8s.io",
    &["leases"],
    &["get", "watch", "list", "delete", "update", "create"],
);
pub const EVENTS: Rule = (
    "",
    &["events"],
    &["list", "watch", "create", "update", "patch"],
);

/// kubernetes-csi/external-provisioner v6.3.0, deploy/kubernetes/rbac.yaml.
pub const PROVISIONER: Sidecar = Sidecar {
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
pub const ATTACHER: Sidecar = Sidecar {
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
pub const SNAPSHOTTER: Sidecar = Sidecar {
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
pub const RESIZER: Sidecar = Sidecar {
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
pub const LIVENESS_PROBE: Sidecar = Sidecar {
    container: "liveness-probe",
    image: "livenessprobe",
    tag: "v2.19.0",
    cluster_rules: &[],
    namespace_rules: &[],
};

/// kubernetes-csi/node-driver-registrar v2.17.0: talks to the kubelet's
/// registration socket only (its README: no RBAC needed).
pub const REGISTRAR: Sidecar = Sidecar {
    container: "node-driver-registrar",
    image: "csi-node-driver-registrar",
    tag: "v2.17.0",
    cluster_rules: &[],
    namespace_rules: &[],
};

pub const CONTROLLER_SIDECARS: &[&Sidecar] = &[
    &PROVISIONER,
    &ATTACHER,
    &SNAPSHOTTER,
    &RESIZER,
    &LIVENESS_PROBE,
];
pub const NODE_SIDECARS: &[&Sidecar] = &[&REGISTRAR, &LIVENESS_PROBE];
