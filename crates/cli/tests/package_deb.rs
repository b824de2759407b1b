//! The .deb: packaging/build-deb.sh run on the test-built binary (no release
//! build), the package unpacked into a scratch root with `dpkg-deb -x`, and
//! its contents checked: the binary runs, the unit verifies, completions and
//! man pages name real subcommands, the plugin sits where Proxmox loads it,
//! and the shipped client config is what the CLI reads. Then dpkg itself
//! installs it into a throwaway root (`dpkg --root`, its own admin
//! directory): files land, conffiles are registered, an edited conffile
//! survives a reinstall, `-r` removes the files and keeps the conffiles,
//! `--purge` removes those too.

mod common;

use common::*;
use std::path::Path;
use std::process::Command;

const ROOT_OF_REPO: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");

/// Subcommands every completion script and the man pages must know.
const SUBCOMMANDS: &[&str] = &["status", "volume", "snapshot", "pool", "group", "cluster"];

#[test]
fn deb_installs_binary_unit_plugin_completions_and_man_pages() {
    if let Some(reason) = missing_tools(&["dpkg-deb", "dpkg", "make", "perl", "gzip", "busybox"]) {
        skip(&reason);
        return;
    }
    let tmp = TempDir::new("deb");
    let out_dir = tmp.path().join("out");
    let mut build = cmd(
        &format!("{ROOT_OF_REPO}/packaging/build-deb.sh"),
        &[
            "--binary",
            trireme_bin(),
            "--out",
            out_dir.to_str().unwrap(),
        ],
    );
    // A debug binary is large: compressing it would be most of the test's time.
    build.env("DEB_COMPRESS", "none");
    let built = run_t(&mut build, std::time::Duration::from_secs(300));
    let deb = built
        .trim()
        .lines()
        .last()
        .expect("build-deb.sh printed no path");
    assert!(Path::new(deb).is_file(), "no .deb at '{deb}'");

    let control = run(&mut cmd("dpkg-deb", &["-f", deb, "Package", "Version"]));
    let version = env!("CARGO_PKG_VERSION");
    assert!(
        control.contains("Package: trireme") && control.contains(&format!("Version: {version}")),
        "control fields: {control}"
    );

    let root = tmp.path().join("root");
    run(&mut cmd("dpkg-deb", &["-x", deb, root.to_str().unwrap()]));
    let control_dir = tmp.path().join("control");
    run(&mut cmd(
        "dpkg-deb",
        &["-e", deb, control_dir.to_str().unwrap()],
    ));
    let conffiles = std::fs::read_to_string(control_dir.join("conffiles")).unwrap();
    for conffile in ["/etc/default/trireme", "/etc/trireme/client.toml"] {
        assert!(
            conffiles.lines().any(|line| line == conffile),
            "{conffile} not a conffile: {conffiles}"
        );
        assert!(root.join(&conffile[1..]).is_file(), "{conffile} missing");
    }

    // The binary runs.
    let binary = root.join("usr/bin/trireme");
    let printed = run(&mut cmd(binary.to_str().unwrap(), &["--version"]));
    assert_eq!(printed.trim(), format!("trireme {version}"));

    // The unit: `trireme node run`, restarted on failure, settings from the
    // environment file the package ships.
    let unit_path = root.join("usr/lib/systemd/system/trireme.service");
    let unit = std::fs::read_to_string(&unit_path).unwrap();
    for line in [
        "ExecStart=/usr/bin/trireme node run $TRIREME_NODE_ARGS",
        "Restart=on-failure",
        "EnvironmentFile=-/etc/default/trireme",
        "StateDirectory=trireme",
    ] {
        assert!(
            unit.lines().any(|l| l == line),
            "unit lacks '{line}':\n{unit}"
        );
    }
    let settings = std::fs::read_to_string(root.join("etc/default/trireme")).unwrap();
    let node_args = settings
        .lines()
        .find_map(|line| line.strip_prefix("TRIREME_NODE_ARGS="))
        .expect("/etc/default/trireme sets no TRIREME_NODE_ARGS")
        .trim_matches('"');
    // Every option the settings file passes is one `node run` knows.
    let node_run_help = run(&mut cmd(
        binary.to_str().unwrap(),
        &["node", "run", "--help"],
    ));
    for option in node_args
        .split_whitespace()
        .filter(|word| word.starts_with("--"))
    {
        assert!(node_run_help.contains(option), "`node run` has no {option}");
    }
    verify_unit(&unit, &binary, tmp.path());

    // Completions, generated from the clap definitions.
    for completion in [
        "usr/share/bash-completion/completions/trireme",
        "usr/share/zsh/vendor-completions/_trireme",
        "usr/share/fish/vendor_completions.d/trireme.fish",
    ] {
        let text = std::fs::read_to_string(root.join(completion))
            .unwrap_or_else(|e| panic!("{completion}: {e}"));
        for sub in SUBCOMMANDS
            .iter()
            .chain(&["attach", "detach", "join-token"])
        {
            assert!(text.contains(sub), "{completion} does not mention `{sub}`");
        }
    }

    // Man pages: one per command, gzipped, in roff.
    let man = root.join("usr/share/man/man1");
    for page in [
        "trireme",
        "trireme-node-run",
        "trireme-volume-attach",
        "trireme-snapshot-create",
    ] {
        let path = man.join(format!("{page}.1.gz"));
        let text = run(&mut cmd("gzip", &["-dc", path.to_str().unwrap()]));
        assert!(text.contains(".TH"), "{page}.1 is not a man page");
        assert!(
            text.contains(&page.replace('-', "\\-")),
            "{page}.1 does not name itself"
        );
    }
    let top = run(&mut cmd(
        "gzip",
        &["-dc", man.join("trireme.1.gz").to_str().unwrap()],
    ));
    for sub in SUBCOMMANDS {
        assert!(
            top.contains(&format!("trireme\\-{sub}(1)")),
            "trireme.1 does not list `{sub}`"
        );
    }
    assert!(
        !man.join("trireme-generate.1.gz").exists(),
        "the hidden `generate` got a man page"
    );

    // The plugin: where Proxmox loads it, the same files as the repository's.
    for file in [
        "PVE/Storage/Custom/TriremePlugin.pm",
        "PVE/Storage/Custom/Trireme/Api.pm",
        "PVE/Storage/Custom/Trireme/Local.pm",
        "PVE/Storage/Custom/Trireme/Device.pm",
    ] {
        let installed = std::fs::read(root.join("usr/share/perl5").join(file))
            .unwrap_or_else(|e| panic!("/usr/share/perl5/{file}: {e}"));
        let source = std::fs::read(format!("{ROOT_OF_REPO}/integrations/proxmox/{file}")).unwrap();
        assert!(
            installed == source,
            "/usr/share/perl5/{file} differs from the repository's"
        );
    }

    // The shipped client config is read: without --api the CLI goes to its
    // address (nothing listens on the port this test put there).
    let config = root.join("etc/trireme/client.toml");
    let shipped = std::fs::read_to_string(&config).unwrap();
    assert!(shipped.contains("api = [\"127.0.0.1:7450\"]"), "{shipped}");
    let port = free_port();
    let edited = shipped.replace("127.0.0.1:7450", &format!("127.0.0.1:{port}"));
    std::fs::write(&config, edited).unwrap();
    let mut status = cmd(binary.to_str().unwrap(), &["status"]);
    status
        .env("TRIREME_CLIENT_CONFIG", &config)
        .env_remove("TRIREME_API");
    let failed = run_fail(&mut status);
    assert!(
        failed.stderr.contains(&format!("127.0.0.1:{port}")),
        "the CLI did not use the config's address: {}",
        failed.stderr
    );

    install_with_dpkg(deb, tmp.path());
}

/// A root for `dpkg --root`: an empty admin directory, and a shell for the
/// maintainer scripts, which dpkg runs chrooted into the root. The shell is
/// busybox-static (it needs no libraries there); with no
/// /run/systemd/system in the root the scripts take their no-systemd
/// branches, so this shows they run and succeed, not what they do under
/// systemd.
fn throwaway_root(dir: &Path) -> Result<(), String> {
    let busybox = run(&mut cmd("sh", &["-c", "command -v busybox"]));
    let linked = exec(&mut cmd("ldd", &[busybox.trim()]), CLI_TIMEOUT);
    if linked.success() {
        return Err(format!(
            "{} is linked dynamically: the maintainer scripts need busybox-static",
            busybox.trim()
        ));
    }
    let admin = dir.join("var/lib/dpkg");
    for sub in ["info", "updates", "triggers"] {
        std::fs::create_dir_all(admin.join(sub)).unwrap();
    }
    for file in ["status", "available"] {
        std::fs::write(admin.join(file), "").unwrap();
    }
    std::fs::create_dir_all(dir.join("bin")).unwrap();
    std::fs::copy(busybox.trim(), dir.join("bin/sh")).unwrap();
    Ok(())
}

/// `dpkg --root=ROOT ARGS...`, which must succeed; its stdout.
fn dpkg(root: &Path, args: &[&str]) -> String {
    let mut command = cmd("dpkg", &[format!("--root={}", root.display())]);
    command.args(args);
    let out = exec(&mut command, std::time::Duration::from_secs(300));
    assert!(out.success(), "{}", out.describe(&format!("dpkg {args:?}")));
    out.stdout
}

fn installed_conffiles(status: &str) -> Vec<String> {
    status
        .lines()
        .skip_while(|line| *line != "Conffiles:")
        .skip(1)
        .take_while(|line| line.starts_with(' '))
        .filter_map(|line| line.split_whitespace().next().map(str::to_string))
        .collect()
}

/// The package installed, reinstalled and removed by dpkg in a scratch root.
/// libc6 is not in that root's database, so `--force-depends`: the root
/// holds the package alone, not a system it would run on.
fn install_with_dpkg(deb: &str, tmp: &Path) {
    // chroot(2) for the maintainer scripts needs root.
    let uid = run(&mut cmd("id", &["-u"]));
    if uid.trim() != "0" {
        skip("dpkg --root runs the maintainer scripts in a chroot, which needs root");
        return;
    }
    let root = tmp.join("dpkg-root");
    if let Err(reason) = throwaway_root(&root) {
        skip(&reason);
        return;
    }
    dpkg(&root, &["--force-depends", "-i", deb]);
    let status = dpkg(&root, &["-s", "trireme"]);
    assert!(status.contains("Status: install ok installed"), "{status}");
    assert_eq!(
        installed_conffiles(&status),
        ["/etc/default/trireme", "/etc/trireme/client.toml"],
        "{status}"
    );
    let listed = dpkg(&root, &["-L", "trireme"]);
    for file in [
        "/usr/bin/trireme",
        "/usr/lib/systemd/system/trireme.service",
        "/usr/share/perl5/PVE/Storage/Custom/TriremePlugin.pm",
        "/usr/share/man/man1/trireme-node-run.1.gz",
        "/usr/share/bash-completion/completions/trireme",
        "/etc/default/trireme",
        "/etc/trireme/client.toml",
    ] {
        assert!(
            listed.lines().any(|line| line == file),
            "dpkg -L does not list {file}"
        );
        assert!(root.join(&file[1..]).is_file(), "{file} did not land");
    }
    let printed = run(&mut cmd(
        root.join("usr/bin/trireme").to_str().unwrap(),
        &["--version"],
    ));
    assert!(printed.starts_with("trireme "), "{printed}");

    // An admin's edit of a conffile survives a reinstall.
    let client = root.join("etc/trireme/client.toml");
    let edited = format!(
        "{}# edited by the admin\n",
        std::fs::read_to_string(&client).unwrap()
    );
    std::fs::write(&client, &edited).unwrap();
    dpkg(&root, &["--force-depends", "-i", deb]);
    assert_eq!(std::fs::read_to_string(&client).unwrap(), edited);

    // Removal takes the files and leaves the conffiles, as configured.
    dpkg(&root, &["-r", "trireme"]);
    let status = dpkg(&root, &["-s", "trireme"]);
    assert!(
        status.contains("Status: deinstall ok config-files"),
        "{status}"
    );
    for gone in [
        "usr/bin/trireme",
        "usr/lib/systemd/system/trireme.service",
        "usr/share/perl5/PVE/Storage/Custom/TriremePlugin.pm",
    ] {
        assert!(!root.join(gone).exists(), "/{gone} is left after dpkg -r");
    }
    assert_eq!(std::fs::read_to_string(&client).unwrap(), edited);
    assert!(root.join("etc/default/trireme").is_file());

    // Purging takes the conffiles too.
    dpkg(&root, &["--purge", "trireme"]);
    assert!(!client.exists() && !root.join("etc/default/trireme").exists());
    let query = exec(
        cmd("dpkg", &[format!("--root={}", root.display())]).args(["-s", "trireme"]),
        CLI_TIMEOUT,
    );
    assert!(!query.success(), "trireme is still known after --purge");
}

/// `systemd-analyze verify` of the unit, its ExecStart pointed at the
/// unpacked binary (verify checks that the program exists). Warnings exit 0,
/// so any line about the unit fails the test.
fn verify_unit(unit: &str, binary: &Path, tmp: &Path) {
    if !have_tool("systemd-analyze") {
        eprintln!("systemd-analyze is missing: the unit file is not verified");
        return;
    }
    let dir = tmp.join("unit");
    std::fs::create_dir_all(&dir).unwrap();
    let copy = dir.join("trireme.service");
    std::fs::write(
        &copy,
        unit.replace("/usr/bin/trireme", binary.to_str().unwrap()),
    )
    .unwrap();
    let mut verify = Command::new("systemd-analyze");
    verify.args(["verify", "--man=no"]).arg(&copy);
    let out = exec(&mut verify, CLI_TIMEOUT);
    let complaints: Vec<&str> = out
        .stderr
        .lines()
        .filter(|line| line.contains("trireme.service"))
        .collect();
    assert!(
        out.success() && complaints.is_empty(),
        "systemd-analyze verify:\n{}",
        out.describe("systemd-analyze verify trireme.service")
    );
}

/// Precedence of the API address: --api, then TRIREME_API, then the client
/// config file, then the default. Each address is a port nothing listens on,
/// so the error names the one the CLI chose.
#[test]
fn api_flag_beats_environment_beats_client_config() {
    let tmp = TempDir::new("client-config");
    let config = tmp.path().join("client.toml");
    let [from_file, from_env, from_flag] = [free_port(), free_port(), free_port()];
    std::fs::write(&config, format!("api = [\"127.0.0.1:{from_file}\"]\n")).unwrap();
    let tried = |env_api: Option<u16>, flag: Option<u16>| {
        let mut c = cmd(trireme_bin(), &["volume", "list"]);
        c.env("TRIREME_CLIENT_CONFIG", &config)
            .env_remove("TRIREME_API");
        if let Some(port) = env_api {
            c.env("TRIREME_API", format!("127.0.0.1:{port}"));
        }
        if let Some(port) = flag {
            c.arg("--api").arg(format!("127.0.0.1:{port}"));
        }
        run_fail(&mut c).stderr
    };
    let chose = |stderr: String, port: u16| {
        assert!(
            stderr.contains(&format!("127.0.0.1:{port}/"))
                || stderr.contains(&format!("127.0.0.1:{port}:")),
            "expected port {port}: {stderr}"
        );
    };
    chose(tried(None, None), from_file);
    chose(tried(Some(from_env), None), from_env);
    chose(tried(Some(from_env), Some(from_flag)), from_flag);

    // A named file that is missing or wrong is an error naming it.
    let mut c = cmd(trireme_bin(), &["status"]);
    c.env("TRIREME_CLIENT_CONFIG", tmp.path().join("missing.toml"));
    let stderr = run_fail(&mut c).stderr;
    assert!(stderr.contains("missing.toml"), "{stderr}");
    std::fs::write(&config, "api = 7450\n").unwrap();
    let mut c = cmd(trireme_bin(), &["status"]);
    c.env("TRIREME_CLIENT_CONFIG", &config);
    let stderr = run_fail(&mut c).stderr;
    assert!(
        stderr.contains("client.toml") && stderr.contains("`api`"),
        "{stderr}"
    );
}
