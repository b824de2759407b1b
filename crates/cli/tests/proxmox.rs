//! The Proxmox VE storage plugin (integrations/proxmox) driven by its Perl
//! tests against a real three-node cluster: the tests call the plugin the
//! way PVE::Storage does, with a small stand-in for Proxmox's base class
//! and storage.cfg parser (integrations/proxmox/t/lib), since Proxmox itself
//! cannot be installed here. Last, the node a VM's disk is attached on is
//! killed and the disk activated on another node (HA's restart). The
//! plugin's kernel nbd path (t/40-kernel-nbd.t) needs the kernel's nbd
//! module, which this machine lacks: tests/kernel_nbd.rs runs it in a QEMU
//! guest, and here it skips itself.

mod common;

use common::replicated::*;
use common::*;
use std::path::PathBuf;
use std::time::Duration;

fn plugin_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../integrations/proxmox")
}

/// Perl with the modules the plugin uses (all shipped by Proxmox VE).
fn perl_ready() -> Option<String> {
    if let Some(missing) = missing_tools(&["perl", "prove"]) {
        return Some(missing);
    }
    let modules = exec(
        &mut cmd(
            "perl",
            &["-MJSON", "-MHTTP::Tiny", "-MIO::Socket::IP", "-e", "1"],
        ),
        Duration::from_secs(30),
    );
    (!modules.success()).then(|| format!("perl modules missing: {}", modules.stderr.trim()))
}

#[test]
fn the_proxmox_plugin_passes_its_tests_against_a_three_node_cluster() {
    if let Some(reason) = perl_ready() {
        skip(&reason);
        return;
    }
    let mut nodes = three_nodes();
    let token = std::fs::read_to_string(nodes[0].data_dir().join("admin.token")).unwrap();
    let spec: Vec<String> = nodes
        .iter()
        .map(|node| format!("{}={}", node.spec.name.as_deref().unwrap(), node.api_url()))
        .collect();
    // Addresses where nothing listens: the cluster as seen when it is down.
    let dead: Vec<String> = (0..2)
        .map(|_| format!("http://127.0.0.1:{}", free_port()))
        .collect();
    let state = TempDir::new("pve-state");
    let prove = |scripts: &[&str], extra: &[(&str, String)]| {
        let mut prove = cmd("prove", &["-v", "-I", ".", "-I", "t/lib"]);
        prove
            .args(scripts)
            .current_dir(plugin_dir())
            .env("TRIREME_TEST_NODES", spec.join(","))
            .env("TRIREME_TEST_TOKEN", token.trim())
            .env("TRIREME_TEST_DEAD_APIS", dead.join(","))
            .env("TRIREME_PVE_STATE_DIR", state.path());
        for (key, value) in extra {
            prove.env(key, value);
        }
        let out = exec(&mut prove, Duration::from_secs(600));
        println!("{}\n{}", out.stdout, out.stderr);
        out
    };
    let passed = |out: &CmdOut, what: &str, node: &TestNode| {
        assert!(
            out.success() && out.stdout.contains("Result: PASS"),
            "{}\n--- node log ---\n{}",
            out.describe(what),
            node.log_tail()
        );
    };
    // t/40-kernel-nbd.t skips itself here (no nbd module: the nodes make
    // no kernel devices); tests/kernel_nbd.rs runs it in a QEMU guest.
    let scripts = ["t/10-lifecycle.t", "t/20-bad-input.t", "t/40-kernel-nbd.t"];
    let out = prove(&scripts, &[]);
    passed(&out, &format!("prove {}", scripts.join(" ")), &nodes[0]);

    // HA: the VM's node dies; activating elsewhere takes its disk over.
    let from = ("TRIREME_TEST_HA_FROM", "n2".to_string());
    let out = prove(
        &["t/30-ha-takeover.t"],
        &[from.clone(), ("TRIREME_TEST_HA_PHASE", "prepare".into())],
    );
    passed(&out, "prove t/30-ha-takeover.t (prepare)", &nodes[1]);
    nodes[1].kill9();
    let killed_at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let out = prove(
        &["t/30-ha-takeover.t"],
        &[
            from,
            ("TRIREME_TEST_HA_PHASE", "takeover".into()),
            ("TRIREME_TEST_HA_KILLED_AT", format!("{killed_at:.3}")),
        ],
    );
    passed(&out, "prove t/30-ha-takeover.t (takeover)", &nodes[0]);

    // The tests leave no volume behind once the dead node is back and has
    // removed its copy of the HA test's disk.
    nodes[1].restart();
    let mut volumes = serde_json::Value::Null;
    let empty = wait_until(Duration::from_secs(60), || {
        volumes = nodes[0].cli_json(&["volume", "list"]);
        volumes == serde_json::json!([])
    });
    assert!(empty, "volumes left: {volumes:#}");
}
