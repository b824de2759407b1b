//! `trireme-csi` refuses a configuration it cannot serve, saying what to
//! give instead, before it listens.

use std::process::Command;

fn refused(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_trireme-csi"))
        .args(args)
        .env_remove("NODE_NAME")
        .env_remove("CSI_ENDPOINT")
        .output()
        .expect("run trireme-csi");
    assert!(!out.status.success(), "{args:?} was accepted");
    String::from_utf8_lossy(&out.stderr).to_string()
}

#[test]
fn a_node_plugin_without_its_node_name_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let endpoint = format!("--endpoint=unix://{}/csi.sock", dir.path().display());
    let error = refused(&["--mode=node", &endpoint]);
    assert!(error.contains("--node-name"), "{error}");
}

#[test]
fn a_tcp_endpoint_and_an_empty_api_list_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let error = refused(&["--mode=controller", "--endpoint=tcp://127.0.0.1:1"]);
    assert!(error.contains("unix socket"), "{error}");
    let endpoint = format!("--endpoint=unix://{}/csi.sock", dir.path().display());
    let error = refused(&["--mode=controller", &endpoint, "--api=,"]);
    assert!(error.contains("--api"), "{error}");
}

#[test]
fn a_missing_token_file_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let endpoint = format!("--endpoint=unix://{}/csi.sock", dir.path().display());
    let error = refused(&[
        "--mode=controller",
        &endpoint,
        "--token-file=/nonexistent/trireme-token",
    ]);
    assert!(error.contains("/nonexistent/trireme-token"), "{error}");
}
