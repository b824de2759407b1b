//! Request validation and error answers, through the real router, on a node
//! with no pools: none of these requests reaches the store.

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
    )
    .await
    .unwrap();
    let router = router(ApiState {
        node: Arc::new(node),
        addresses: Arc::new(Addresses::default()),
        cluster,
    });
    TestNode {
        _directory: directory,
        router,
    }
}

async fn call(method: &str, uri: &str, body: Option<&str>) -> (StatusCode, Value) {
    let node = test_node().await;
    let mut request = Request::builder().method(method).uri(uri);
    if body.is_some() {
        request = request.header(header::CONTENT_TYPE, "application/json");
    }
    let request = request
        .body(Body::from(body.unwrap_or("").to_string()))
        .unwrap();
    let response = node.router.oneshot(request).await.unwrap();
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
    let largest = create(r#"{"name":"a","size_bytes":18446744073709551615}"#).await;
    assert_error(
        &largest,
        StatusCode::BAD_REQUEST,
        "invalid_size",
        "multiple of 4096",
    );
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
        "/api/v1/pools/{name}/scan",
    ] {
        assert!(json["paths"][path].is_object(), "{path} missing");
    }
}
