//! Request validation and error answers, through the real router, on a node
//! with no pools: none of these requests reaches the store. The attach and
//! replica tests give the cluster state more nodes and pools by writing
//! commands directly (no agent runs here).

use axum::body::Body;
use axum::http::{header, Request, StatusCode};
use http_body_util::BodyExt;
use serde_json::Value;
use std::sync::Arc;
use tower::ServiceExt;

use super::{router, Addresses, ApiState};
use crate::Node;

struct TestNode {
    _directory: tempfile::TempDir,
    router: axum::Router,
    cluster: Arc<crate::cluster::Cluster>,
}

/// A node without pools in a one-node cluster of its own; its Raft never
/// needs the network, so the API address is never dialled.
async fn test_node() -> TestNode {
    let directory = tempfile::tempdir().unwrap();
    let node = Node::open(directory.path()).unwrap();
    let cluster = crate::cluster::start::start(
        crate::cluster::ClusterConfig {
            name: trireme_types::NodeName::new("test").unwrap(),
            labels: Default::default(),
            join: None,
            trust_loopback: true,
        },
        directory.path(),
        "127.0.0.1:9".to_string(),
        None,
        None,
    )
    .await
    .unwrap();
    let node = Arc::new(node);
    let replication =
        crate::replicated::Replication::open(node.clone(), cluster.clone(), "127.0.0.1:9".into())
            .unwrap();
    let devices = Arc::new(crate::local_device::LocalDevices::new(
        directory.path(),
        directory.path().join("nbd.sock"),
        Default::default(),
    ));
    let router = router(ApiState {
        node,
        addresses: Arc::new(Addresses::default()),
        cluster: cluster.clone(),
        replication,
        metrics: crate::metrics::Metrics::new(),
        devices,
    });
    TestNode {
        _directory: directory,
        router,
        cluster,
    }
}

impl TestNode {
    async fn call(&self, method: &str, uri: &str, body: Option<&str>) -> (StatusCode, Value) {
        let mut request = Request::builder().method(method).uri(uri);
        if body.is_some() {
            request = request.header(header::CONTENT_TYPE, "application/json");
        }
        let request = request
            .body(Body::from(body.unwrap_or("").to_string()))
            .unwrap();
        let response = self.router.clone().oneshot(request).await.unwrap();
        let status = response.status();
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        let json = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes)
                .unwrap_or_else(|_| panic!("not JSON: {}", String::from_utf8_lossy(&bytes)))
        };
        (status, json)
    }

    async fn write(&self, command: trireme_control::Command) -> trireme_control::Reply {
        self.cluster.write(command).await.unwrap()
    }
}

/// One request to a fresh node.
async fn call(method: &str, uri: &str, body: Option<&str>) -> (StatusCode, Value) {
    test_node().await.call(method, uri, body).await
}

fn assert_error(answer: &(StatusCode, Value), status: StatusCode, code: &str, words: &str) {
    let (actual_status, json) = answer;
    assert_eq!(*actual_status, status, "{json}");
    assert_eq!(json["code"], code, "{json}");
    let message = json["error"].as_str().unwrap();
    assert!(message.contains(words), "'{message}' lacks '{words}'");
}

#[tokio::test]
async fn health_and_empty_lists() {
    let (status, json) = call("GET", "/api/v1/health", None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(json["status"], "ok");
    assert_eq!(
        call("GET", "/api/v1/volumes", None).await.1,
        Value::Array(vec![])
    );
    assert_eq!(
        call("GET", "/api/v1/pools", None).await.1,
        Value::Array(vec![])
    );
}

#[tokio::test]
async fn volume_sizes_are_checked() {
    let create = |body: &'static str| call("POST", "/api/v1/volumes", Some(body));
    let zero = create(r#"{"name":"a","size_bytes":0}"#).await;
    assert_error(
        &zero,
        StatusCode::BAD_REQUEST,
        "invalid_size",
        "greater than 0",
    );
    let unaligned = create(r#"{"name":"a","size_bytes":4097}"#).await;
    assert_error(
        &unaligned,
        StatusCode::BAD_REQUEST,
        "invalid_size",
        "multiple of 4096",
    );
    for size_bytes in [
        "18446744073709551615",
        "9223372036854775808",
        "2251799813685248",
    ] {
        let body = format!(r#"{{"name":"a","size_bytes":{size_bytes}}}"#);
        let largest = call("POST", "/api/v1/volumes", Some(&body)).await;
        assert_error(
            &largest,
            StatusCode::BAD_REQUEST,
            "invalid_size",
            "larger than the largest volume, 1125899906842624 bytes (1 PiB)",
        );
    }
    let negative = create(r#"{"name":"a","size_bytes":-1}"#).await;
    assert_error(
        &negative,
        StatusCode::BAD_REQUEST,
        "invalid_body",
        "size_bytes",
    );
    let grow = call(
        "POST",
        "/api/v1/volumes/a/grow",
        Some(r#"{"size_bytes":0}"#),
    )
    .await;
    assert_error(
        &grow,
        StatusCode::BAD_REQUEST,
        "invalid_size",
        "greater than 0",
    );
}

#[tokio::test]
async fn bodies_and_names_are_checked() {
    let create = |body: &'static str| call("POST", "/api/v1/volumes", Some(body));
    let unknown = create(r#"{"name":"a","size_bytes":4096,"colour":"red"}"#).await;
    assert_error(&unknown, StatusCode::BAD_REQUEST, "invalid_body", "colour");
    let broken = create(r#"{"name":"a","#).await;
    assert_error(
        &broken,
        StatusCode::BAD_REQUEST,
        "invalid_body",
        "not valid",
    );
    let name = create(r#"{"name":"a b","size_bytes":4096}"#).await;
    assert_error(
        &name,
        StatusCode::BAD_REQUEST,
        "invalid_name",
        "volume name 'a b'",
    );
    let path_name = call("GET", "/api/v1/volumes/-x", None).await;
    assert_error(&path_name, StatusCode::BAD_REQUEST, "invalid_name", "'-x'");
    let pool = create(r#"{"name":"a","size_bytes":4096,"pool":"no/pe"}"#).await;
    assert_error(&pool, StatusCode::BAD_REQUEST, "invalid_name", "pool name");
}

#[tokio::test]
async fn pool_requests_are_checked() {
    let create = |body: &'static str| call("POST", "/api/v1/pools", Some(body));
    let class = create(r#"{"name":"p","path":"/tmp/p.img","class":"tape"}"#).await;
    assert_error(
        &class,
        StatusCode::BAD_REQUEST,
        "invalid_request",
        "nvme, ssd or hdd",
    );
    let relative = create(r#"{"name":"p","path":"p.img"}"#).await;
    assert_error(
        &relative,
        StatusCode::BAD_REQUEST,
        "invalid_path",
        "absolute",
    );
    let missing_directory =
        create(r#"{"name":"p","path":"/nonexistent/dir/p.img","size_bytes":1073741824}"#).await;
    assert_error(
        &missing_directory,
        StatusCode::BAD_REQUEST,
        "invalid_path",
        "does not exist",
    );
    let size = create(r#"{"name":"p","path":"/tmp/p.img","size_bytes":0}"#).await;
    assert_error(
        &size,
        StatusCode::BAD_REQUEST,
        "invalid_size",
        "greater than 0",
    );
}

#[tokio::test]
async fn missing_things_are_404_and_no_pool_is_507() {
    let volume = call("GET", "/api/v1/volumes/nothere", None).await;
    assert_error(
        &volume,
        StatusCode::NOT_FOUND,
        "volume_not_found",
        "'nothere'",
    );
    let delete = call("DELETE", "/api/v1/volumes/nothere", None).await;
    assert_error(
        &delete,
        StatusCode::NOT_FOUND,
        "volume_not_found",
        "'nothere'",
    );
    let pool = call("GET", "/api/v1/pools/nothere", None).await;
    assert_error(&pool, StatusCode::NOT_FOUND, "pool_not_found", "'nothere'");
    let scan = call("POST", "/api/v1/pools/nothere/scan", None).await;
    assert_error(&scan, StatusCode::NOT_FOUND, "pool_not_found", "'nothere'");
    let named_pool = call(
        "POST",
        "/api/v1/volumes",
        Some(r#"{"name":"a","size_bytes":4096,"pool":"p"}"#),
    )
    .await;
    assert_error(&named_pool, StatusCode::NOT_FOUND, "pool_not_found", "'p'");
    let any_pool = call(
        "POST",
        "/api/v1/volumes",
        Some(r#"{"name":"a","size_bytes":4096}"#),
    )
    .await;
    assert_error(
        &any_pool,
        StatusCode::INSUFFICIENT_STORAGE,
        "no_pool_available",
        "pool create",
    );
    let endpoint = call("GET", "/api/v1/nothing", None).await;
    assert_error(
        &endpoint,
        StatusCode::NOT_FOUND,
        "unknown_endpoint",
        "/api/v1/nothing",
    );
}

#[tokio::test]
async fn openapi_document_lists_the_endpoints() {
    let (status, json) = call("GET", "/api/v1/openapi.json", None).await;
    assert_eq!(status, StatusCode::OK);
    assert!(json["openapi"].as_str().unwrap().starts_with("3."));
    for path in [
        "/api/v1/volumes",
        "/api/v1/volumes/{name}",
        "/api/v1/volumes/{name}/grow",
        "/api/v1/volumes/{name}/attach",
        "/api/v1/volumes/{name}/detach",
        "/api/v1/volumes/{name}/replicas",
        "/api/v1/volumes/{name}/replicas/{node}",
        "/api/v1/pools/{name}/scan",
    ] {
        assert!(json["paths"][path].is_object(), "{path} missing");
    }
}

/// The answering node `test` (id 1) and nodes `n2` and `n3`, each with a
/// pool `p1`, and a volume `v` with diskful replicas on `test` and `n2`
/// (and so a tiebreaker on `n3`).
async fn three_nodes_and_a_volume() -> TestNode {
    use trireme_control::{Command, NodeRegistration, PoolRecord, PoolReport};
    use trireme_types::{DeviceClass, NodeId, NodeName, PoolName, VolumeName};
    let node = test_node().await;
    let now = crate::cluster::auth::now_ms();
    for name in ["n2", "n3"] {
        node.write(Command::AddNode {
            node: NodeRegistration {
                name: NodeName::new(name).unwrap(),
                api_address: format!("{name}.test:9"),
                nbd_address: None,
                data_address: None,
                labels: Default::default(),
            },
            nonce: name.to_string(),
            now_ms: now,
        })
        .await;
    }
    for id in 1..=3 {
        node.write(Command::ReportPools {
            node: NodeId(id),
            pools: vec![PoolReport {
                name: PoolName::new("p1").unwrap(),
                record: PoolRecord {
                    class: DeviceClass::Ssd,
                    capacity_bytes: 1 << 40,
                    free_bytes: 1 << 40,
                    online: true,
                    reported_ms: now,
                },
            }],
        })
        .await;
    }
    node.write(Command::CreateVolume {
        name: VolumeName::new("v").unwrap(),
        size_bytes: 1 << 30,
        group: None,
        replicas: None,
        nodes: Some(vec![
            NodeName::new("test").unwrap(),
            NodeName::new("n2").unwrap(),
        ]),
        pool: None,
        adopt: None,
        now_ms: now,
    })
    .await;
    node
}

/// The volume's replicas as `node: state`, sorted.
fn replica_states(volume: &Value) -> Vec<String> {
    let mut states: Vec<String> = volume["replicas"]
        .as_array()
        .unwrap()
        .iter()
        .map(|replica| {
            format!(
                "{}: {}",
                replica["node"].as_str().unwrap(),
                replica["state"].as_str().unwrap()
            )
        })
        .collect();
    states.sort();
    states
}

#[tokio::test]
async fn volumes_attach_and_detach_through_the_api() {
    let node = three_nodes_and_a_volume().await;
    let (status, volume) = node.call("GET", "/api/v1/volumes/v", None).await;
    assert_eq!(status, StatusCode::OK, "{volume}");
    assert_eq!(volume["generation"], 1);
    assert_eq!(volume["primaries"], serde_json::json!([]));
    assert_eq!(
        replica_states(&volume),
        ["n2: up-to-date", "n3: tiebreaker", "test: up-to-date"]
    );
    let first = &volume["replicas"][0];
    assert_eq!(first["in_sync"], true, "{volume}");
    assert_eq!(first["observed"], "pending", "{volume}");

    let attach = |body: &'static str| node.call("POST", "/api/v1/volumes/v/attach", Some(body));
    let nowhere = attach(r#"{"node":"nowhere"}"#).await;
    assert_error(
        &nowhere,
        StatusCode::NOT_FOUND,
        "node_not_found",
        "'nowhere'",
    );
    let missing = node
        .call(
            "POST",
            "/api/v1/volumes/nope/attach",
            Some(r#"{"node":"test"}"#),
        )
        .await;
    assert_error(
        &missing,
        StatusCode::NOT_FOUND,
        "volume_not_found",
        "'nope'",
    );
    let typo = attach(r#"{"nod":"test"}"#).await;
    assert_error(&typo, StatusCode::BAD_REQUEST, "invalid_body", "nod");

    let (status, attached) = attach(r#"{"node":"test"}"#).await;
    assert_eq!(status, StatusCode::OK, "{attached}");
    assert_eq!(attached["generation"], 2);
    assert_eq!(attached["primaries"], serde_json::json!(["test"]));
    assert_eq!(
        replica_states(&attached),
        ["n2: up-to-date", "n3: tiebreaker", "test: primary"]
    );
    // Again: nothing changes.
    let (status, again) = attach(r#"{"node":"test","allow_two_primaries":false}"#).await;
    assert_eq!(
        (status, &again["generation"]),
        (StatusCode::OK, &Value::from(2))
    );

    let elsewhere = attach(r#"{"node":"n2"}"#).await;
    assert_error(
        &elsewhere,
        StatusCode::CONFLICT,
        "already_attached",
        "on node 'test'",
    );
    assert_error(
        &elsewhere,
        StatusCode::CONFLICT,
        "already_attached",
        "--allow-two-primaries",
    );
    let delete = node.call("DELETE", "/api/v1/volumes/v", None).await;
    assert_error(
        &delete,
        StatusCode::CONFLICT,
        "volume_attached",
        "detach it first",
    );

    let (status, two) = attach(r#"{"node":"n2","allow_two_primaries":true}"#).await;
    assert_eq!(status, StatusCode::OK, "{two}");
    assert_eq!(two["generation"], 2);
    assert_eq!(two["primaries"], serde_json::json!(["test", "n2"]));

    let detach = |body: &'static str| node.call("POST", "/api/v1/volumes/v/detach", Some(body));
    let which = detach("{}").await;
    assert_error(&which, StatusCode::BAD_REQUEST, "which_primary", "--node");
    let not_there = detach(r#"{"node":"n3"}"#).await;
    assert_error(&not_there, StatusCode::CONFLICT, "not_primary", "test, n2");
    let (status, one) = detach(r#"{"node":"test"}"#).await;
    assert_eq!(status, StatusCode::OK, "{one}");
    assert_eq!(one["primaries"], serde_json::json!(["n2"]));
    let (status, none) = detach(r#"{"node":null}"#).await;
    assert_eq!(status, StatusCode::OK, "{none}");
    assert_eq!(none["primaries"], serde_json::json!([]));
    assert_eq!(none["generation"], 2);
    let not_attached = detach("{}").await;
    assert_error(
        &not_attached,
        StatusCode::CONFLICT,
        "not_attached",
        "volume 'v' is not attached",
    );
}

#[tokio::test]
async fn replicas_are_added_and_removed_through_the_api() {
    use trireme_control::{Command, SyncProgress};
    use trireme_types::{NodeId, VolumeName};
    let node = three_nodes_and_a_volume().await;
    let add = |body: &'static str| node.call("POST", "/api/v1/volumes/v/replicas", Some(body));
    let exists = add(r#"{"node":"test"}"#).await;
    assert_error(&exists, StatusCode::CONFLICT, "replica_exists", "'test'");
    let nowhere = add(r#"{"node":"nowhere"}"#).await;
    assert_error(
        &nowhere,
        StatusCode::NOT_FOUND,
        "node_not_found",
        "'nowhere'",
    );
    let no_pool = add(r#"{"pool":"p9"}"#).await;
    assert_error(&no_pool, StatusCode::CONFLICT, "placement_failed", "p9");

    // The only free node is n3: it trades its tiebreaker for a replica,
    // which is outdated until synced.
    let (status, added) = add(r#"{"node":null,"pool":null}"#).await;
    assert_eq!(status, StatusCode::OK, "{added}");
    assert_eq!(
        replica_states(&added),
        ["n2: up-to-date", "n3: outdated", "test: up-to-date"]
    );

    node.write(Command::ReportSync {
        name: VolumeName::new("v").unwrap(),
        node: NodeId(3),
        progress: Some(SyncProgress {
            done_bytes: 1 << 28,
            total_bytes: 1 << 30,
            rate_bytes_per_sec: 1 << 26,
            reported_ms: crate::cluster::auth::now_ms(),
        }),
    })
    .await;
    let (_, syncing) = node.call("GET", "/api/v1/volumes/v", None).await;
    let n3 = syncing["replicas"]
        .as_array()
        .unwrap()
        .iter()
        .find(|replica| replica["node"] == "n3")
        .unwrap();
    assert_eq!(n3["state"], "syncing 25%", "{syncing}");
    assert_eq!(n3["in_sync"], false);
    assert_eq!(n3["sync"]["percent"], 25);
    assert_eq!(n3["sync"]["eta_secs"], 12, "768 MiB left at 64 MiB/s");
    let (_, status) = node.call("GET", "/api/v1/status", None).await;
    assert_eq!(status["health"], "HEALTH_WARN");
    let warnings = status["warnings"].to_string();
    assert!(
        warnings.contains("the replica on n3 is syncing: 25%") && warnings.contains("12s left"),
        "{warnings}"
    );

    let replicas = &node;
    let remove = |node_name: &'static str| async move {
        let uri = format!("/api/v1/volumes/v/replicas/{node_name}");
        replicas.call("DELETE", &uri, None).await
    };
    let nowhere = remove("nowhere").await;
    assert_error(
        &nowhere,
        StatusCode::NOT_FOUND,
        "node_not_found",
        "'nowhere'",
    );
    let (status, removed) = remove("n3").await;
    assert_eq!(status, StatusCode::OK, "{removed}");
    assert_eq!(
        replica_states(&removed),
        ["n2: up-to-date", "test: up-to-date"]
    );
    let gone = remove("n3").await;
    assert_error(
        &gone,
        StatusCode::NOT_FOUND,
        "replica_not_found",
        "no diskful replica",
    );
    // Two in-sync replicas left, no node for a tiebreaker: one may still go,
    // the last may not.
    let (status, _) = remove("n2").await;
    assert_eq!(status, StatusCode::OK);
    let last = remove("test").await;
    assert_error(
        &last,
        StatusCode::CONFLICT,
        "last_in_sync",
        "last up-to-date replica",
    );
}

#[tokio::test]
async fn a_grow_past_the_largest_volume_changes_nothing() {
    let node = three_nodes_and_a_volume().await;
    let (_, before) = node.call("GET", "/api/v1/volumes/v", None).await;
    for size_bytes in ["9223372036854775808", "2251799813685248"] {
        let body = format!(r#"{{"size_bytes":{size_bytes}}}"#);
        let grow = node
            .call("POST", "/api/v1/volumes/v/grow", Some(&body))
            .await;
        assert_error(
            &grow,
            StatusCode::BAD_REQUEST,
            "invalid_size",
            "larger than the largest volume, 1125899906842624 bytes (1 PiB)",
        );
    }
    let (_, after) = node.call("GET", "/api/v1/volumes/v", None).await;
    assert_eq!(before, after);
    // The state machine refuses it too, whoever proposes it.
    let refused = node
        .cluster
        .write(trireme_control::Command::GrowVolume {
            name: trireme_types::VolumeName::new("v").unwrap(),
            size_bytes: 1 << 63,
        })
        .await
        .unwrap_err();
    assert!(
        refused
            .to_string()
            .contains("larger than the largest volume"),
        "{refused}"
    );
}

#[tokio::test]
async fn a_volume_with_snapshots_is_deleted_only_when_asked() {
    use trireme_control::{Command, Reply};
    use trireme_types::{NodeId, SnapshotName, VolumeName};
    let node = three_nodes_and_a_volume().await;
    let name = VolumeName::new("v").unwrap();
    node.write(Command::AttachVolume {
        name: name.clone(),
        node: NodeId(1),
        allow_two_primaries: false,
        force_takeover: false,
        now_ms: 1,
    })
    .await;
    let Reply::Snapshot(snapshot) = node
        .write(Command::CreateSnapshot {
            volume: name.clone(),
            name: SnapshotName::new("s1").unwrap(),
            scheduled: false,
            now_ms: 2,
        })
        .await
    else {
        panic!("a snapshot");
    };
    node.write(Command::ReportSnapshot {
        volume: name.clone(),
        id: snapshot.id,
        from: NodeId(1),
        holders: [NodeId(1), NodeId(2)].into(),
        error: None,
    })
    .await;
    node.write(Command::DetachVolume {
        name: name.clone(),
        node: None,
    })
    .await;

    let plain = node.call("DELETE", "/api/v1/volumes/v", None).await;
    assert_error(
        &plain,
        StatusCode::CONFLICT,
        "has_snapshots",
        "snapshot(s) s1",
    );
    assert_error(
        &plain,
        StatusCode::CONFLICT,
        "has_snapshots",
        "--with-snapshots",
    );
    let typo = node
        .call("DELETE", "/api/v1/volumes/v?with_snapshot=true", None)
        .await;
    assert_error(
        &typo,
        StatusCode::BAD_REQUEST,
        "invalid_request",
        "with_snapshots=true",
    );
    let (status, _) = node
        .call("DELETE", "/api/v1/volumes/v?with_snapshots=false", None)
        .await;
    assert_eq!(status, StatusCode::CONFLICT);
    let (status, body) = node
        .call("DELETE", "/api/v1/volumes/v?with_snapshots=true", None)
        .await;
    // No agent runs here to remove the copies: deleting, not gone.
    assert!(
        [StatusCode::ACCEPTED, StatusCode::NO_CONTENT].contains(&status),
        "{status} {body}"
    );
    assert!(node.cluster.state.read().volumes[&name].deleting);
}

/// Device requests name what is wrong before anything runs: a bad name, an
/// unknown volume, a request meant for another node, a body with unknown
/// fields. (Making a real device: tests/csi.rs.)
#[tokio::test]
async fn device_requests_with_bad_input_are_refused_by_name() {
    let node = test_node().await;
    let put = |uri: &'static str, body: &'static str| node.call("PUT", uri, Some(body));
    assert_error(
        &put("/api/v1/volumes/..secret/device", r#"{"node":"test"}"#).await,
        StatusCode::BAD_REQUEST,
        "invalid_name",
        "'.'",
    );
    assert_error(
        &put("/api/v1/volumes/%2E%2E/device", r#"{"node":"test"}"#).await,
        StatusCode::BAD_REQUEST,
        "invalid_name",
        "'.'",
    );
    assert_error(
        &put("/api/v1/volumes/ghost/device", r#"{"node":"test"}"#).await,
        StatusCode::NOT_FOUND,
        "volume_not_found",
        "'ghost'",
    );
    assert_error(
        &put("/api/v1/volumes/ghost/device", r#"{"node":"n9"}"#).await,
        StatusCode::CONFLICT,
        "other_node",
        "not 'n9'",
    );
    assert_error(
        &put(
            "/api/v1/volumes/ghost/device",
            r#"{"node":"test","size":1}"#,
        )
        .await,
        StatusCode::BAD_REQUEST,
        "invalid_body",
        "size",
    );
    assert_error(
        &node.call("GET", "/api/v1/volumes/ghost/device", None).await,
        StatusCode::NOT_FOUND,
        "device_not_found",
        "(test)",
    );
    assert_error(
        &node
            .call("DELETE", "/api/v1/volumes/ghost/device", None)
            .await,
        StatusCode::NOT_FOUND,
        "volume_not_found",
        "'ghost'",
    );
    let (status, json) = node.call("GET", "/api/v1/devices", None).await;
    assert_eq!(status, StatusCode::OK, "{json}");
    assert_eq!(json, Value::Array(vec![]));
    // A path with a slash is no volume's device route at all.
    let (status, _) = node
        .call(
            "PUT",
            "/api/v1/volumes/a/b/device",
            Some(r#"{"node":"test"}"#),
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

/// A replica its node could not make fails the create: 507 naming the
/// pool when the pool was full (as the agent classifies the store's
/// ENOSPC), 500 for anything else. The failure is reported as the agent
/// reports it (no agent runs here).
#[tokio::test]
async fn a_replica_that_found_its_pool_full_fails_the_create_with_507() {
    use trireme_control::{Command, PoolRecord, PoolReport};
    use trireme_store::StoreError;
    use trireme_types::{DeviceClass, NodeId, PoolName, VolumeName};
    let node = test_node().await;
    let pool = PoolName::new("p1").unwrap();
    node.write(Command::ReportPools {
        node: NodeId(1),
        pools: vec![PoolReport {
            name: pool.clone(),
            record: PoolRecord {
                class: DeviceClass::Ssd,
                capacity_bytes: 1 << 30,
                free_bytes: 1 << 30,
                online: true,
                reported_ms: crate::cluster::auth::now_ms(),
            },
        }],
    })
    .await;
    let full = crate::NodeError::Store(StoreError::Io {
        context: "metadata database commit volume create".into(),
        source: std::io::Error::from_raw_os_error(libc::ENOSPC),
    });
    let broken = crate::NodeError::Store(StoreError::Fatal("bad block".into()));
    for (name, error, status, code, words) in [
        (
            "full",
            full,
            StatusCode::INSUFFICIENT_STORAGE,
            "replica_failed",
            "test: no space left in pool 'p1'",
        ),
        (
            "broken",
            broken,
            StatusCode::INTERNAL_SERVER_ERROR,
            "replica_failed",
            "test: pool is damaged and was taken offline: bad block",
        ),
    ] {
        let body = format!(r#"{{"name":"{name}","size_bytes":1048576,"pool":"p1"}}"#);
        let volume = VolumeName::new(name).unwrap();
        let report = async {
            let mut id = None;
            node.cluster
                .wait_for_state(std::time::Duration::from_secs(10), |state| {
                    id = state.volumes.get(&volume).map(|record| record.id);
                    id.is_some()
                })
                .await;
            node.write(Command::ReportReplica {
                volume: volume.clone(),
                volume_id: id.expect("the volume was recorded"),
                node: NodeId(1),
                observed: trireme_control::ReplicaObserved::Failed(crate::agent::replica_failure(
                    &error,
                    Some(pool.clone()),
                )),
                allocated_bytes: 0,
                size_bytes: None,
            })
            .await;
        };
        let (answer, ()) = tokio::join!(node.call("POST", "/api/v1/volumes", Some(&body)), report);
        assert_error(&answer, status, code, words);
        // Taken back: deleting until its node's agent removes the replica.
        assert!(
            node.cluster
                .state
                .read()
                .volumes
                .get(&volume)
                .is_none_or(|record| record.deleting),
            "the failed volume's record is taken back"
        );
    }
}
