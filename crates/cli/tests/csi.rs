//! The CSI driver (`trireme-csi`, crates/csi) against a real three-node
//! cluster of `trireme node run` processes on 127.0.0.1:
//! - csi-sanity, the community's conformance suite, for mount and block
//!   volumes with snapshots, clones and expansion: every spec passes, and
//!   the only skipped ones are those whose capability the driver does not
//!   advertise (listed in `ALLOWED_SKIPS`, with why);
//! - on a cluster whose API wants the admin token: secrets missing or
//!   wrong and bad parameters are refused and leave no volume behind; a
//!   MULTI_NODE_MULTI_WRITER block volume gets a second primary on a live
//!   node; a node dies with a volume published: ControllerPublish on
//!   another node takes it over at once and the data is there; a second
//!   publish of a single-writer volume while its node lives is refused;
//!   a volume grown while mounted is grown on the node at its next stage;
//! - the node plugin run as a container runs it (its own PID namespace)
//!   and killed with everything it started while fio writes to a block
//!   and an ext4 volume: fio sees no error, because the node daemon owns
//!   the block devices (nbdfuse and the loop devices), not the plugin.
//!
//! The driver binary is another package's: it is built here with cargo
//! (a no-op when it is fresh) and found beside the `trireme` binary.

mod common;

use common::replicated::*;
use common::*;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use trireme_csi::csi::controller_client::ControllerClient;
use trireme_csi::csi::node_client::NodeClient;
use trireme_csi::csi::volume_capability::{access_mode::Mode, AccessMode, AccessType};
use trireme_csi::csi::volume_capability::{BlockVolume, MountVolume};
use trireme_csi::csi::*;

const MIB: i64 = 1 << 20;

/// Specs csi-sanity skips because the driver does not advertise their
/// capability (a substring of the spec's name, and why).
const ALLOWED_SKIPS: &[(&str, &str)] = &[
    (
        "GetSnapshot",
        "GET_SNAPSHOT (alpha) not advertised: ListSnapshots by id does it",
    ),
    (
        "ModifyVolume",
        "MODIFY_VOLUME not advertised: no mutable volume attributes",
    ),
    ("volume attribute class", "MODIFY_VOLUME not advertised"),
    (
        "already published but is incompatible",
        "PUBLISH_READONLY not advertised: a read-only publish is a NodePublish option only",
    ),
    (
        "single node multi writer",
        "SINGLE_NODE_MULTI_WRITER not advertised",
    ),
    (
        "single node single writer",
        "SINGLE_NODE_MULTI_WRITER not advertised",
    ),
    (
        "accessibility requirements",
        "SNAPSHOT_ACCESSIBILITY_CONSTRAINTS not advertised",
    ),
    (
        "VolumeHealth",
        "GET_VOLUME_HEALTH (CSI 1.13) not in the v1.12 spec the driver speaks",
    ),
    (
        "StorageHealth",
        "GET_STORAGE_HEALTH (CSI 1.13) not in the v1.12 spec",
    ),
    (
        "max attach limit",
        "no per-node attach limit (max_volumes_per_node 0)",
    ),
    (
        "pagination should detect",
        "marked pending (XIt) in csi-sanity itself",
    ),
    (
        "GroupController",
        "no group controller service (volume group snapshots)",
    ),
    ("VolumeGroupSnapshot", "no group controller service"),
    ("SnapshotMetadata", "no snapshot metadata service (alpha)"),
];

/// The driver's binary, built if needed. The build selects the whole
/// workspace, as `cargo test --workspace` does: with `-p trireme-csi` alone
/// cargo resolves other features for shared dependencies and rebuilds them.
///
/// `TRIREME_CSI_BIN` names another build of the driver instead (main's,
/// say, to see which tests fail with it); nothing is built then.
fn csi_bin() -> PathBuf {
    if let Some(bin) = std::env::var_os("TRIREME_CSI_BIN") {
        return PathBuf::from(bin);
    }
    let bin = Path::new(trireme_bin()).with_file_name("trireme-csi");
    if let Some(cargo) = std::env::var_os("CARGO") {
        let out = exec(
            std::process::Command::new(cargo).args([
                "build",
                "-q",
                "--workspace",
                "--bin",
                "trireme-csi",
            ]),
            Duration::from_secs(900),
        );
        assert!(out.success(), "{}", out.describe("building trireme-csi"));
    }
    assert!(
        bin.exists(),
        "no {}: build it with `cargo build -p trireme-csi`",
        bin.display()
    );
    bin
}

/// csi-sanity: on PATH (.ci/run installs it into /usr/local/bin) or in
/// Go's default bin directory.
fn csi_sanity() -> Option<PathBuf> {
    if have_tool("csi-sanity") {
        return Some(PathBuf::from("csi-sanity"));
    }
    let home = std::env::var_os("HOME").map(PathBuf::from)?;
    let go_bin = home.join("go/bin/csi-sanity");
    go_bin.exists().then_some(go_bin)
}

fn prerequisites() -> Option<PathBuf> {
    if !tools_or_skip(&[
        "nbdfuse",
        "fusermount3",
        "losetup",
        "mkfs.ext4",
        "setsid",
        "blkid",
    ]) {
        return None;
    }
    if !Path::new("/dev/fuse").exists() || !Path::new("/dev/loop-control").exists() {
        skip("no /dev/fuse or /dev/loop-control");
        return None;
    }
    let sanity = csi_sanity();
    if sanity.is_none() {
        skip("csi-sanity is not installed (go install github.com/kubernetes-csi/csi-test/v5/cmd/csi-sanity@v5.6.0)");
    }
    sanity
}

/// One `trireme-csi` process.
struct Plugin {
    child: Option<Child>,
    socket: PathBuf,
    log: PathBuf,
    args: Vec<String>,
    /// Run as the init of a PID namespace of its own, as in a container.
    pid_namespace: bool,
}

impl Plugin {
    fn start(
        dir: &Path,
        tag: &str,
        mode: &str,
        node: Option<&TestNode>,
        apis: &[&TestNode],
    ) -> Plugin {
        Plugin::start_with_token(dir, tag, mode, node, apis, None)
    }

    /// A plugin given `--token-file` (the Secret a deployment mounts).
    fn start_with_token(
        dir: &Path,
        tag: &str,
        mode: &str,
        node: Option<&TestNode>,
        apis: &[&TestNode],
        token_file: Option<&Path>,
    ) -> Plugin {
        let socket = dir.join(format!("{tag}.sock"));
        let api: Vec<String> = apis.iter().map(|n| n.api_url()).collect();
        let mut args = vec![
            format!("--endpoint=unix://{}", socket.display()),
            format!("--mode={mode}"),
            format!("--api={}", api.join(",")),
            format!("--state-dir={}", dir.join(format!("{tag}-state")).display()),
        ];
        if let Some(file) = token_file {
            args.push(format!("--token-file={}", file.display()));
        }
        if let Some(node) = node {
            args.push(format!(
                "--node-name={}",
                node.spec.name.as_deref().unwrap()
            ));
            args.push(format!(
                "--nbd-socket={}",
                node.data_dir().join("nbd.sock").display()
            ));
        }
        let mut plugin = Plugin {
            child: None,
            socket,
            log: dir.join(format!("{tag}.log")),
            args,
            pid_namespace: false,
        };
        plugin.launch();
        plugin
    }

    /// A plugin serving every service (`--mode all`) as the init of a PID
    /// namespace of its own.
    fn start_in_pid_namespace(
        dir: &Path,
        tag: &str,
        node: Option<&TestNode>,
        apis: &[&TestNode],
    ) -> Plugin {
        let mut plugin = Plugin::start(dir, tag, "all", node, apis);
        plugin.kill9();
        plugin.pid_namespace = true;
        plugin.launch();
        plugin
    }

    fn launch(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        let _ = std::fs::remove_file(&self.socket);
        let mut command = if self.pid_namespace {
            let mut command = std::process::Command::new("unshare");
            // --kill-child: the namespace also ends when the test kills unshare.
            command
                .args(["--pid", "--fork", "--kill-child", "--"])
                .arg(csi_bin());
            command
        } else {
            std::process::Command::new(csi_bin())
        };
        let child = command
            .args(&self.args)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::from(log.try_clone().unwrap()))
            .stderr(Stdio::from(log))
            .spawn()
            .expect("start trireme-csi");
        self.child = Some(child);
        let up = wait_until(Duration::from_secs(20), || {
            std::os::unix::net::UnixStream::connect(&self.socket).is_ok()
        });
        assert!(
            up,
            "trireme-csi did not listen on {}: {}",
            self.socket.display(),
            self.log_text()
        );
    }

    fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Kills the init of the plugin's PID namespace (the plugin itself):
    /// the kernel then kills every process left in the namespace, as when
    /// a container ends.
    fn kill_namespace(&mut self) {
        assert!(self.pid_namespace, "the plugin has no PID namespace");
        let child = self.child.take().expect("the plugin runs");
        let children = format!("/proc/{0}/task/{0}/children", child.id());
        let init: i32 = std::fs::read_to_string(&children)
            .unwrap_or_default()
            .split_whitespace()
            .next()
            .and_then(|pid| pid.parse().ok())
            .unwrap_or_else(|| panic!("unshare has no child in {children}"));
        // SAFETY: a plain kill(2) of a process this test started.
        assert_eq!(unsafe { libc::kill(init, libc::SIGKILL) }, 0);
        let mut child = child;
        let _ = child.wait();
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    async fn channel(&self) -> tonic::transport::Channel {
        let path = self.socket.clone();
        tonic::transport::Endpoint::try_from("http://[::1]:1")
            .unwrap()
            .connect_with_connector(tower::service_fn(move |_| {
                let path = path.clone();
                async move {
                    let stream = tokio::net::UnixStream::connect(path).await?;
                    Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
                }
            }))
            .await
            .expect("connect to the CSI socket")
    }

    async fn controller(&self) -> ControllerClient<tonic::transport::Channel> {
        ControllerClient::new(self.channel().await)
    }

    async fn node(&self) -> NodeClient<tonic::transport::Channel> {
        NodeClient::new(self.channel().await)
    }
}

impl Drop for Plugin {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// Takes down what the driver or the node daemon set up under `dir`
/// (mounts, loop devices, nbdfuse), whatever state a test left it in.
struct Cleanup(PathBuf);

impl Drop for Cleanup {
    fn drop(&mut self) {
        let dir = self.0.display().to_string();
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let mut points: Vec<String> = mountinfo
            .lines()
            .filter_map(|line| line.split(' ').nth(4))
            .filter(|point| point.starts_with(&dir))
            .map(str::to_string)
            .collect();
        points.reverse();
        for point in points.iter().filter(|p| !p.ends_with("/fuse")) {
            let _ = exec(&mut cmd("umount", &["-l", point]), Duration::from_secs(20));
        }
        let loops = exec(
            &mut cmd("losetup", &["-n", "-O", "NAME,BACK-FILE", "-l"]),
            Duration::from_secs(20),
        );
        for line in loops.stdout.lines() {
            let mut fields = line.split_whitespace();
            if let (Some(device), Some(file)) = (fields.next(), fields.next()) {
                if file.starts_with(&dir) {
                    let _ = exec(
                        &mut cmd("losetup", &["-d", device]),
                        Duration::from_secs(20),
                    );
                }
            }
        }
        for point in points.iter().filter(|p| p.ends_with("/fuse")) {
            let _ = exec(
                &mut cmd("fusermount3", &["-u", "-z", point]),
                Duration::from_secs(20),
            );
        }
    }
}

/// Cleanups of the test's directory, then of each node's data directory
/// (where the daemon keeps the devices it made), in that order: a vector
/// drops its elements first to last, so the test's mounts on the devices
/// go before the devices. Declare it after the nodes, so it runs before
/// they stop.
fn cleanup_after(dir: &Path, nodes: &[TestNode]) -> Vec<Cleanup> {
    std::iter::once(dir.to_path_buf())
        .chain(nodes.iter().map(TestNode::data_dir))
        .map(Cleanup)
        .collect()
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// The spec names csi-sanity's JUnit report lists, and which were skipped.
fn junit_cases(path: &Path) -> Vec<(String, bool)> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.split("<testcase ")
        .skip(1)
        .map(|case| {
            let name = case
                .split("name=\"")
                .nth(1)
                .and_then(|rest| rest.split('"').next())
                .unwrap_or("")
                .replace("&#34;", "\"")
                .replace("&amp;", "&");
            let end = case.find("</testcase>").unwrap_or(case.len());
            let skipped = case[..end].contains("<skipped");
            (name, skipped)
        })
        .collect()
}

fn run_sanity(sanity: &Path, dir: &Path, plugin: &Plugin, access: &str) {
    let junit = dir.join(format!("junit-{access}.xml"));
    let mut command = std::process::Command::new(sanity);
    command
        .arg(format!("--csi.endpoint={}", plugin.socket.display()))
        .arg(format!(
            "--csi.mountdir={}",
            dir.join(format!("mnt-{access}")).display()
        ))
        .arg(format!(
            "--csi.stagingdir={}",
            dir.join(format!("stage-{access}")).display()
        ))
        .arg(format!("--csi.testvolumeaccesstype={access}"))
        .arg(format!("--csi.testvolumesize={}", 64 * MIB))
        .arg(format!("--csi.testvolumeexpandsize={}", 128 * MIB))
        .arg(format!("--csi.junitfile={}", junit.display()));
    let out = exec(&mut command, Duration::from_secs(600));
    let cases = junit_cases(&junit);
    assert!(
        out.success() && !cases.is_empty(),
        "{}\n--- driver log ---\n{}",
        out.describe(&format!("csi-sanity ({access})")),
        tail_of(&plugin.log_text())
    );
    let unexpected: Vec<&String> = cases
        .iter()
        .filter(|(name, skipped)| {
            *skipped && !ALLOWED_SKIPS.iter().any(|(part, _)| name.contains(part))
        })
        .map(|(name, _)| name)
        .collect();
    assert!(
        unexpected.is_empty(),
        "csi-sanity ({access}) skipped specs whose capability is advertised: {unexpected:#?}"
    );
    let ran = cases.iter().filter(|(_, skipped)| !skipped).count();
    println!(
        "csi-sanity {access}: {ran} specs passed, {} skipped:",
        cases.len() - ran
    );
    for (name, _) in cases.iter().filter(|(_, skipped)| *skipped) {
        println!("  skipped: {name}");
    }
}

fn tail_of(text: &str) -> &str {
    let start = text.len().saturating_sub(6000);
    let start = (start..text.len())
        .find(|i| text.is_char_boundary(*i))
        .unwrap_or(text.len());
    &text[start..]
}

#[test]
fn csi_sanity_passes_for_mount_and_block_volumes() {
    let Some(sanity) = prerequisites() else {
        return;
    };
    let nodes = three_nodes();
    let dir = TempDir::new("csi-sanity");
    let _cleanup = cleanup_after(dir.path(), &nodes);
    let apis: Vec<&TestNode> = nodes.iter().collect();
    let plugin = Plugin::start(dir.path(), "all", "all", Some(&nodes[0]), &apis);
    run_sanity(&sanity, dir.path(), &plugin, "mount");
    run_sanity(&sanity, dir.path(), &plugin, "block");
    // Every volume and snapshot the suite made is gone again.
    let volumes = nodes[0].cli_json(&["volume", "list"]);
    assert_eq!(
        volumes.as_array().map(Vec::len),
        Some(0),
        "left behind: {volumes:#}"
    );
}

fn mount_capability(mode: Mode) -> VolumeCapability {
    VolumeCapability {
        access_type: Some(AccessType::Mount(MountVolume {
            fs_type: "ext4".into(),
            ..Default::default()
        })),
        access_mode: Some(AccessMode { mode: mode as i32 }),
    }
}

fn block_capability(mode: Mode) -> VolumeCapability {
    VolumeCapability {
        access_type: Some(AccessType::Block(BlockVolume {})),
        access_mode: Some(AccessMode { mode: mode as i32 }),
    }
}

async fn create(plugin: &Plugin, name: &str, capability: &VolumeCapability) -> String {
    try_create(plugin, name, capability, &[], &[])
        .await
        .unwrap_or_else(|status| panic!("CreateVolume {name}: {status}"))
}

/// CreateVolume of 64 MiB with StorageClass `parameters` and `secrets`.
async fn try_create(
    plugin: &Plugin,
    name: &str,
    capability: &VolumeCapability,
    parameters: &[(&str, &str)],
    secrets: &[(&str, &str)],
) -> Result<String, tonic::Status> {
    let pairs = |list: &[(&str, &str)]| {
        list.iter()
            .map(|(key, value)| (key.to_string(), value.to_string()))
            .collect()
    };
    let created = plugin
        .controller()
        .await
        .create_volume(CreateVolumeRequest {
            name: name.into(),
            capacity_range: Some(CapacityRange {
                required_bytes: 64 * MIB,
                limit_bytes: 0,
            }),
            volume_capabilities: vec![capability.clone()],
            parameters: pairs(parameters),
            secrets: pairs(secrets),
            ..Default::default()
        })
        .await?;
    Ok(created.into_inner().volume.unwrap().volume_id)
}

async fn publish(
    plugin: &Plugin,
    volume: &str,
    node: &str,
    capability: &VolumeCapability,
) -> Result<(), tonic::Status> {
    plugin
        .controller()
        .await
        .controller_publish_volume(ControllerPublishVolumeRequest {
            volume_id: volume.into(),
            node_id: node.into(),
            volume_capability: Some(capability.clone()),
            ..Default::default()
        })
        .await
        .map(drop)
}

/// NodeStage then NodePublish on `plugin` at `dir/<tag>-{staging,target}`.
async fn stage_and_publish(
    plugin: &Plugin,
    volume: &str,
    capability: &VolumeCapability,
    dir: &Path,
    tag: &str,
) -> PathBuf {
    let staging = dir.join(format!("{tag}-staging"));
    let target = dir.join(format!("{tag}-target"));
    std::fs::create_dir_all(&staging).unwrap();
    let mut node = plugin.node().await;
    node.node_stage_volume(NodeStageVolumeRequest {
        volume_id: volume.into(),
        staging_target_path: staging.display().to_string(),
        volume_capability: Some(capability.clone()),
        ..Default::default()
    })
    .await
    .unwrap_or_else(|status| panic!("NodeStageVolume: {status}\n{}", tail_of(&plugin.log_text())));
    node.node_publish_volume(NodePublishVolumeRequest {
        volume_id: volume.into(),
        staging_target_path: staging.display().to_string(),
        target_path: target.display().to_string(),
        volume_capability: Some(capability.clone()),
        ..Default::default()
    })
    .await
    .expect("NodePublishVolume");
    target
}

/// Three nodes whose API wants the admin token even from loopback
/// (`--trust-loopback=false`), as it does from the CSI pods of a
/// Kubernetes cluster. On 127.0.0.2: the tests' CLI calls then send the
/// token, as a remote client does.
fn three_locked_nodes() -> Vec<TestNode> {
    let spec = |name: &str, join: Option<(String, String)>| NodeSpec {
        name: Some(name.to_string()),
        join,
        ip: Some("127.0.0.2".into()),
        args: vec!["--trust-loopback=false".into()],
        ..NodeSpec::default()
    };
    let first = TestNode::start_with(spec("n1", None));
    let token = join_token(&first);
    let mut nodes = vec![first];
    for name in ["n2", "n3"] {
        let join = Some((nodes[0].api_address(), token.clone()));
        nodes.push(TestNode::start_with(spec(name, join)));
    }
    let settled = wait_until(Duration::from_secs(60), || {
        let status = nodes[0].cli_json(&["status"]);
        status["nodes"]["online"] == 3 && status["leader"].is_string()
    });
    assert!(settled, "cluster did not settle\n{}", nodes[0].log_tail());
    nodes
}

fn assert_refused(result: Result<String, tonic::Status>, code: tonic::Code, words: &str) {
    let status = result.expect_err("a CreateVolume that must be refused was answered");
    assert_eq!(status.code(), code, "{status}");
    assert!(status.message().contains(words), "{status}");
}

fn primaries(node: &TestNode, volume: &str) -> Vec<String> {
    let shown = show(node, volume);
    let mut names: Vec<String> = shown["primaries"]
        .as_array()
        .unwrap_or_else(|| panic!("no primaries in {shown:#}"))
        .iter()
        .map(|name| name.as_str().unwrap().to_string())
        .collect();
    names.sort();
    names
}

/// NodeUnpublish, NodeUnstage and ControllerUnpublish of what
/// `stage_and_publish` set up as `tag` on `node`.
async fn take_down(
    controller: &Plugin,
    plugin: &Plugin,
    volume: &str,
    node: &str,
    dir: &Path,
    tag: &str,
) {
    let mut client = plugin.node().await;
    client
        .node_unpublish_volume(NodeUnpublishVolumeRequest {
            volume_id: volume.into(),
            target_path: dir.join(format!("{tag}-target")).display().to_string(),
        })
        .await
        .expect("NodeUnpublishVolume");
    client
        .node_unstage_volume(NodeUnstageVolumeRequest {
            volume_id: volume.into(),
            staging_target_path: dir.join(format!("{tag}-staging")).display().to_string(),
        })
        .await
        .expect("NodeUnstageVolume");
    controller
        .controller()
        .await
        .controller_unpublish_volume(ControllerUnpublishVolumeRequest {
            volume_id: volume.into(),
            node_id: node.into(),
            ..Default::default()
        })
        .await
        .expect("ControllerUnpublishVolume");
}

async fn node_expand(
    plugin: &Plugin,
    volume: &str,
    dir: &Path,
    tag: &str,
    capability: &VolumeCapability,
) -> Result<i64, tonic::Status> {
    let expanded = plugin
        .node()
        .await
        .node_expand_volume(NodeExpandVolumeRequest {
            volume_id: volume.into(),
            volume_path: dir.join(format!("{tag}-target")).display().to_string(),
            staging_target_path: dir.join(format!("{tag}-staging")).display().to_string(),
            capacity_range: Some(CapacityRange {
                required_bytes: 128 * MIB,
                limit_bytes: 0,
            }),
            volume_capability: Some(capability.clone()),
            ..Default::default()
        })
        .await?;
    Ok(expanded.into_inner().capacity_bytes)
}

/// The size of the file system mounted at `path`, as df shows it.
fn df_bytes(path: &Path) -> u64 {
    let out = run(&mut cmd(
        "df",
        &["-B1", "--output=size", &path.display().to_string()],
    ));
    out.lines().nth(1).unwrap().trim().parse().unwrap()
}

/// One cluster whose API wants the admin token, a controller and two node
/// plugins given it as a file (the Secret a deployment mounts), and one
/// controller given none:
/// - secrets missing or wrong, unknown parameters, more replicas than
///   nodes, sizes over the pools: refused with the code and words that say
///   what to do, and no volume left behind;
/// - a MULTI_NODE_MULTI_WRITER block volume gets a second primary on a
///   live node (a KubeVirt live migration), and what one writes the other
///   reads;
/// - a single-writer volume's second publish on a live node is refused;
///   when its node dies, a publish elsewhere takes over at once with the
///   data;
/// - expansion: ControllerExpandVolume while the file system is mounted;
///   NodeExpandVolume there is refused (the NBD client keeps the size it
///   connected with: expansion is offline); staged again (on the node that
///   took over), NodeExpandVolume grows the mounted ext4 and df shows it,
///   the data intact.
#[test]
fn a_dead_nodes_volume_is_taken_over_at_once_and_a_live_writer_is_never_doubled() {
    if prerequisites().is_none() {
        return;
    }
    let mut nodes = three_locked_nodes();
    let dir = TempDir::new("csi-takeover");
    let _cleanup = cleanup_after(dir.path(), &nodes);
    let apis: Vec<&TestNode> = nodes.iter().collect();
    let token = std::fs::read_to_string(nodes[0].data_dir().join("admin.token")).unwrap();
    let token = token.trim().to_string();
    let token_file = dir.path().join("admin-token");
    std::fs::write(&token_file, &token).unwrap();
    let with_token = |tag: &str, mode: &str, node: Option<&TestNode>| {
        Plugin::start_with_token(dir.path(), tag, mode, node, &apis, Some(&token_file))
    };
    let controller = with_token("controller", "controller", None);
    let plugin2 = with_token("n2", "node", Some(&nodes[1]));
    let plugin3 = with_token("n3", "node", Some(&nodes[2]));
    let bare = Plugin::start(dir.path(), "bare", "controller", None, &apis);
    let capability = mount_capability(Mode::SingleNodeWriter);
    let rt = runtime();

    // Secrets missing or wrong: UNAUTHENTICATED, saying where the token
    // comes from. A token in the request's secrets wins over the file.
    use tonic::Code;
    let create_with =
        |plugin: &Plugin, name: &str, parameters: &[(&str, &str)], secrets: &[(&str, &str)]| {
            rt.block_on(try_create(plugin, name, &capability, parameters, secrets))
        };
    assert_refused(
        create_with(&bare, "no-token", &[], &[]),
        Code::Unauthenticated,
        "--token-file",
    );
    assert_refused(
        create_with(&controller, "wrong-token", &[], &[("token", "trmadm-0000")]),
        Code::Unauthenticated,
        "refused the admin token",
    );
    let made = create_with(&bare, "secret-token", &[], &[("token", &token)])
        .expect("CreateVolume with the token in its secrets, on a driver without a token file");
    rt.block_on(async {
        bare.controller()
            .await
            .delete_volume(DeleteVolumeRequest {
                volume_id: made.clone(),
                secrets: [("token".to_string(), token.clone())].into(),
            })
            .await
            .expect("DeleteVolume with the token in its secrets")
    });
    // Bad input: refused by name, before or by the cluster.
    assert_refused(
        create_with(&controller, "typo", &[("replica", "2")], &[]),
        Code::InvalidArgument,
        "'replica'",
    );
    assert_refused(
        create_with(&controller, "five", &[("replicas", "5")], &[]),
        Code::FailedPrecondition,
        "needs 5 online nodes",
    );
    let huge = rt.block_on(async {
        controller
            .controller()
            .await
            .create_volume(CreateVolumeRequest {
                name: "huge".into(),
                capacity_range: Some(CapacityRange {
                    required_bytes: 1 << 49,
                    limit_bytes: 0,
                }),
                volume_capabilities: vec![capability.clone()],
                ..Default::default()
            })
            .await
    });
    let huge = huge.expect_err("a volume of 512 TiB");
    assert_eq!(huge.code(), Code::ResourceExhausted, "{huge}");
    // None of them left a volume behind, nor did the one deleted.
    let volumes = nodes[0].cli_json(&["volume", "list"]);
    assert_eq!(
        volumes.as_array().map(Vec::len),
        Some(0),
        "left behind: {volumes:#}"
    );

    // A block volume for a live migration: a second primary on a live
    // node, and the destination reads what the source wrote.
    let shared = block_capability(Mode::MultiNodeMultiWriter);
    let migrating = rt.block_on(create(&controller, "migrating", &shared));
    rt.block_on(publish(&controller, &migrating, "n2", &shared))
        .expect("publish on n2");
    let source = rt.block_on(stage_and_publish(
        &plugin2,
        &migrating,
        &shared,
        dir.path(),
        "vm-n2",
    ));
    rt.block_on(publish(&controller, &migrating, "n3", &shared))
        .unwrap_or_else(|status| panic!("a second primary on live n3: {status}"));
    assert_eq!(primaries(&nodes[0], &migrating), ["n2", "n3"]);
    let destination = rt.block_on(stage_and_publish(
        &plugin3,
        &migrating,
        &shared,
        dir.path(),
        "vm-n3",
    ));
    let pattern = dir.path().join("pattern");
    random_file(&pattern, 1 << 20, 5);
    let dd = |args: &[String]| run(&mut cmd("dd", args));
    dd(&[
        format!("if={}", pattern.display()),
        format!("of={}", source.display()),
        "bs=1M".into(),
        "count=1".into(),
        "oflag=direct".into(),
        "conv=fsync".into(),
    ]);
    let read = dir.path().join("read");
    dd(&[
        format!("if={}", destination.display()),
        format!("of={}", read.display()),
        "bs=1M".into(),
        "count=1".into(),
        "iflag=direct".into(),
    ]);
    assert_eq!(sha256(&read), sha256(&pattern), "n3 reads what n2 wrote");
    // The migration ends: the source lets go, one primary stays.
    rt.block_on(take_down(
        &controller,
        &plugin2,
        &migrating,
        "n2",
        dir.path(),
        "vm-n2",
    ));
    assert_eq!(primaries(&nodes[0], &migrating), ["n3"]);
    rt.block_on(take_down(
        &controller,
        &plugin3,
        &migrating,
        "n3",
        dir.path(),
        "vm-n3",
    ));

    let volume = rt.block_on(create(&controller, "moving", &capability));
    rt.block_on(publish(&controller, &volume, "n2", &capability))
        .expect("publish on n2");
    let target = rt.block_on(stage_and_publish(
        &plugin2,
        &volume,
        &capability,
        dir.path(),
        "n2",
    ));
    let data = target.join("data");
    random_file(&data, 4 << 20, 21);
    let written = sha256(&data);
    run(&mut cmd("sync", &[&data.display().to_string()]));
    wait_in_sync(&nodes[0], &volume, Duration::from_secs(60));

    // n2 lives: a second writer elsewhere is refused, and says why.
    let refused = rt
        .block_on(publish(&controller, &volume, "n3", &capability))
        .expect_err("a second publish of a ReadWriteOnce volume while n2 lives");
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused}");
    assert!(refused.message().contains("n2"), "{refused}");

    // The volume grows while mounted on n2; the device there keeps the
    // size it was staged with, and NodeExpandVolume says so.
    let grown = rt.block_on(async {
        controller
            .controller()
            .await
            .controller_expand_volume(ControllerExpandVolumeRequest {
                volume_id: volume.clone(),
                capacity_range: Some(CapacityRange {
                    required_bytes: 128 * MIB,
                    limit_bytes: 0,
                }),
                volume_capability: Some(capability.clone()),
                ..Default::default()
            })
            .await
            .expect("ControllerExpandVolume")
            .into_inner()
    });
    assert_eq!(grown.capacity_bytes, 128 * MIB);
    assert!(grown.node_expansion_required);
    let stale = rt
        .block_on(node_expand(
            &plugin2,
            &volume,
            dir.path(),
            "n2",
            &capability,
        ))
        .expect_err("NodeExpandVolume on a device staged at the old size");
    assert_eq!(stale.code(), Code::FailedPrecondition, "{stale}");
    assert!(stale.message().contains("stage it again"), "{stale}");

    // n2 dies: the next publish on n3 takes over at once, in one call.
    nodes[1].kill9();
    let started = Instant::now();
    rt.block_on(publish(&controller, &volume, "n3", &capability))
        .unwrap_or_else(|status| {
            panic!(
                "takeover on n3: {status}\n{}",
                tail_of(&controller.log_text())
            )
        });
    let took = started.elapsed();
    assert!(
        controller.log_text().contains("former primary is fenced"),
        "the publish did not fence n2 itself: {}",
        tail_of(&controller.log_text())
    );
    let shown = show(&nodes[0], &volume);
    assert_eq!(shown["primaries"], serde_json::json!(["n3"]), "{shown:#}");
    let moved = rt.block_on(stage_and_publish(
        &plugin3,
        &volume,
        &capability,
        dir.path(),
        "n3",
    ));
    assert_eq!(
        sha256(&moved.join("data")),
        written,
        "the data written on n2 is on n3"
    );
    println!("takeover publish took {took:?}");

    // Staged anew, at the new size: the ext4 grew before it was mounted
    // (resize2fs offline: an online resize needs CAP_SYS_RESOURCE, which
    // this machine does not give), and NodeExpandVolume answers the size.
    // df of an ext4 of 64 MiB shows about 59 MiB, of 128 MiB about 114.
    let before = df_bytes(&moved);
    assert!(
        before > (100 * MIB) as u64,
        "df shows {before} bytes once staged at 128 MiB"
    );
    let capacity = rt
        .block_on(node_expand(
            &plugin3,
            &volume,
            dir.path(),
            "n3",
            &capability,
        ))
        .unwrap_or_else(|status| {
            panic!(
                "NodeExpandVolume on n3: {status}\n{}",
                tail_of(&plugin3.log_text())
            )
        });
    assert_eq!(capacity, 128 * MIB);
    assert_eq!(df_bytes(&moved), before, "df after NodeExpandVolume");
    assert_eq!(
        sha256(&moved.join("data")),
        written,
        "the data survived the growth"
    );
    drop(plugin2);
}

/// An xfs volume grows offline, as Kubernetes does it where the driver
/// advertises OFFLINE expansion (and as this machine's nbdfuse devices
/// need): ControllerExpandVolume while it is unpublished, then staged
/// again at the new size, and NodeExpandVolume runs xfs_growfs on the
/// mounted file system; df shows the new size and the data is intact.
/// 320 MiB: xfsprogs 5.19 and newer refuse a file system under 300 MB.
#[test]
fn an_xfs_volume_grows_offline_with_xfs_growfs() {
    if prerequisites().is_none() {
        return;
    }
    if !tools_or_skip(&["mkfs.xfs", "xfs_growfs"]) {
        return;
    }
    let node = TestNode::start_with(NodeSpec {
        name: Some("n1".into()),
        ..NodeSpec::default()
    });
    let nodes = [node];
    let dir = TempDir::new("csi-xfs");
    let _cleanup = cleanup_after(dir.path(), &nodes);
    let apis: Vec<&TestNode> = nodes.iter().collect();
    let plugin = Plugin::start(dir.path(), "all", "all", Some(&nodes[0]), &apis);
    let capability = VolumeCapability {
        access_type: Some(AccessType::Mount(MountVolume {
            fs_type: "xfs".into(),
            ..Default::default()
        })),
        access_mode: Some(AccessMode {
            mode: Mode::SingleNodeWriter as i32,
        }),
    };
    let rt = runtime();
    let started = Instant::now();
    let sizes = |required_bytes| {
        Some(CapacityRange {
            required_bytes,
            limit_bytes: 0,
        })
    };
    let volume = rt.block_on(async {
        plugin
            .controller()
            .await
            .create_volume(CreateVolumeRequest {
                name: "xfs-grows".into(),
                capacity_range: sizes(320 * MIB),
                volume_capabilities: vec![capability.clone()],
                ..Default::default()
            })
            .await
            .expect("CreateVolume")
            .into_inner()
            .volume
            .unwrap()
            .volume_id
    });
    rt.block_on(publish(&plugin, &volume, "n1", &capability))
        .expect("ControllerPublishVolume");
    let target = rt.block_on(stage_and_publish(
        &plugin,
        &volume,
        &capability,
        dir.path(),
        "n1",
    ));
    println!(
        "created, published and made an xfs: {:?}",
        started.elapsed()
    );
    let data = target.join("data");
    random_file(&data, 4 << 20, 33);
    let written = sha256(&data);
    run(&mut cmd("sync", &[&data.display().to_string()]));
    let before = df_bytes(&target);
    rt.block_on(take_down(&plugin, &plugin, &volume, "n1", dir.path(), "n1"));

    let grown = rt.block_on(async {
        plugin
            .controller()
            .await
            .controller_expand_volume(ControllerExpandVolumeRequest {
                volume_id: volume.clone(),
                capacity_range: sizes(448 * MIB),
                volume_capability: Some(capability.clone()),
                ..Default::default()
            })
            .await
            .expect("ControllerExpandVolume")
            .into_inner()
    });
    assert_eq!(grown.capacity_bytes, 448 * MIB);
    assert!(grown.node_expansion_required);

    rt.block_on(publish(&plugin, &volume, "n1", &capability))
        .expect("ControllerPublishVolume after the growth");
    let target = rt.block_on(stage_and_publish(
        &plugin,
        &volume,
        &capability,
        dir.path(),
        "n1",
    ));
    println!("grown and staged again: {:?}", started.elapsed());
    // Staged anew the device has the new size, the xfs does not yet.
    assert_eq!(df_bytes(&target), before, "df before NodeExpandVolume");
    let capacity = rt
        .block_on(node_expand(&plugin, &volume, dir.path(), "n1", &capability))
        .unwrap_or_else(|status| {
            panic!(
                "NodeExpandVolume: {status}\n{}",
                tail_of(&plugin.log_text())
            )
        });
    assert_eq!(capacity, 448 * MIB);
    let after = df_bytes(&target);
    assert!(
        after >= before + (120 * MIB) as u64,
        "df shows {after} bytes after xfs_growfs, {before} before"
    );
    assert_eq!(sha256(&data), written, "the data survived the growth");
    println!("xfs_growfs done: {:?}", started.elapsed());
    rt.block_on(take_down(&plugin, &plugin, &volume, "n1", dir.path(), "n1"));
}

/// The loop devices whose backing file is under `dir`.
fn loops_under(dir: &Path) -> Vec<String> {
    let out = exec(
        &mut cmd("losetup", &["-n", "-O", "NAME,BACK-FILE", "-l"]),
        Duration::from_secs(20),
    );
    let dir = dir.display().to_string();
    out.stdout
        .lines()
        .filter_map(|line| {
            let (device, file) = line.trim().split_once(char::is_whitespace)?;
            file.trim().starts_with(&dir).then(|| device.to_string())
        })
        .collect()
}

/// The node plugin runs the way a container runs it: in a PID namespace
/// of its own (`unshare --pid --fork`: the plugin is the namespace's
/// init), so killing it makes the kernel kill every process it started,
/// as a container runtime does when the pod restarts. The plugin shares
/// the host's mount namespace, standing in for the kubelet directory's
/// Bidirectional mount propagation.
///
/// Two volumes, ext4 and block, are staged and published, and fio writes
/// to both with crc32c verification while the plugin's namespace dies and
/// a new plugin starts: the block devices belong to the node daemon
/// (nbdfuse, the loop devices), so fio never sees an error and verifies
/// every block. The daemon is then killed and started again: the loop
/// devices stay, and the new plugin's unpublish and unstage of both make
/// the restarted daemon release them (found by their backing files).
#[test]
fn restarting_the_node_plugin_while_fio_writes_interrupts_nothing() {
    if prerequisites().is_none() || !tools_or_skip(&["fio", "unshare"]) {
        return;
    }
    let mut nodes = three_nodes();
    let dir = TempDir::new("csi-restart");
    let _cleanup = cleanup_after(dir.path(), &nodes);
    let apis: Vec<&TestNode> = nodes.iter().collect();
    let mut plugin = Plugin::start_in_pid_namespace(dir.path(), "n1", Some(&nodes[0]), &apis);
    let block = block_capability(Mode::SingleNodeWriter);
    let mount = mount_capability(Mode::SingleNodeWriter);
    let rt = runtime();
    let mut targets = Vec::new();
    for (name, capability) in [("busy-block", &block), ("busy-ext4", &mount)] {
        let volume = rt.block_on(create(&plugin, name, capability));
        rt.block_on(publish(&plugin, &volume, "n1", capability))
            .expect("ControllerPublishVolume");
        let target = rt.block_on(stage_and_publish(
            &plugin,
            &volume,
            capability,
            dir.path(),
            name,
        ));
        targets.push((volume, capability, target));
    }
    let devices_before = loops_under(&nodes[0].data_dir());

    // About five seconds of writes at 8 MiB/s to each, then a verify pass.
    // In the test's directory: fio leaves its verify state files there.
    let job = |name: &str, file: String, size: &str| {
        [
            format!("--name={name}"),
            format!("--filename={file}"),
            format!("--size={size}"),
        ]
    };
    let block_device = targets[0].2.display().to_string();
    let ext4_file = targets[1].2.join("fio-data").display().to_string();
    let mut args: Vec<String> = [
        "--rw=write",
        "--bs=64k",
        "--rate=8m",
        "--direct=1",
        "--ioengine=psync",
        "--verify=crc32c",
        "--do_verify=1",
        "--verify_fatal=1",
    ]
    .iter()
    .map(|arg| arg.to_string())
    .collect();
    args.extend(job("block", block_device, "40M"));
    args.extend(job("ext4", ext4_file, "32M"));
    let mut fio = std::process::Command::new("fio")
        .current_dir(dir.path())
        .args(&args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start fio");
    std::thread::sleep(Duration::from_secs(2));
    plugin.kill_namespace();
    std::thread::sleep(Duration::from_millis(500));
    plugin.launch();
    let finished = wait_until(Duration::from_secs(60), || {
        fio.try_wait().unwrap().is_some()
    });
    if !finished {
        let _ = fio.kill();
    }
    let out = fio.wait_with_output().unwrap();
    let fio_text = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        finished && out.status.success(),
        "fio failed across the node plugin's restart: {fio_text}"
    );
    assert!(
        fio_text.contains("block: (groupid=0") && fio_text.contains("ext4: (groupid=0"),
        "fio ran both jobs: {fio_text}"
    );
    assert_eq!(
        devices_before.len(),
        2,
        "the node daemon holds one loop device per staged volume: {devices_before:?}"
    );
    assert_eq!(
        loops_under(&nodes[0].data_dir()),
        devices_before,
        "the devices outlived the plugin"
    );

    // The new plugin finds the staged volumes: a repeated stage and publish
    // answer at once.
    let name_of = |target: &Path| {
        target
            .file_name()
            .unwrap()
            .to_string_lossy()
            .trim_end_matches("-target")
            .to_string()
    };
    rt.block_on(async {
        for (volume, capability, target) in &targets {
            let again =
                stage_and_publish(&plugin, volume, capability, dir.path(), &name_of(target)).await;
            assert_eq!(&again, target);
        }
    });
    // The daemon dies and starts again (its NBD connections end: the
    // devices' I/O would fail from now on, docs/kubernetes.md). The loop
    // devices stay, the restarted daemon finds them by their backing file,
    // and the plugin's unpublish and unstage release them.
    nodes[0].restart();
    assert_eq!(
        loops_under(&nodes[0].data_dir()),
        devices_before,
        "the loop devices outlive the daemon"
    );
    rt.block_on(async {
        for (volume, _, target) in &targets {
            let name = name_of(target);
            let mut node = plugin.node().await;
            node.node_unpublish_volume(NodeUnpublishVolumeRequest {
                volume_id: volume.clone(),
                target_path: target.display().to_string(),
            })
            .await
            .expect("NodeUnpublishVolume");
            node.node_unstage_volume(NodeUnstageVolumeRequest {
                volume_id: volume.clone(),
                staging_target_path: dir
                    .path()
                    .join(format!("{name}-staging"))
                    .display()
                    .to_string(),
            })
            .await
            .expect("NodeUnstageVolume");
        }
    });
    assert_eq!(
        loops_under(&nodes[0].data_dir()),
        Vec::<String>::new(),
        "the devices are released after NodeUnstageVolume"
    );
}
