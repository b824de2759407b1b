//! The command line. Sizes and names are checked while parsing, so a typo
//! is reported before anything is sent to the node.

use clap::{Args, Parser, Subcommand, ValueEnum};
use std::net::SocketAddr;
use std::path::PathBuf;
use trireme_types::{parse_size, DeviceClass, PoolName, VolumeName};

#[derive(Debug, Parser)]
#[command(
    name = "trireme",
    version,
    about = "trireme: replicated block storage for small clusters",
    long_about = "trireme: replicated block storage for small clusters.\n\n\
        `trireme node run` starts the node daemon on this machine: it keeps storage pools, \
        serves volumes over NBD and answers a REST API. Every other command talks to that API.\n\n\
        Quick start:\n  trireme node run --data-dir /tmp/trireme --demo\n  \
        trireme volume create vm1 --size 32G\n  trireme volume list"
)]
pub struct Cli {
    /// The node's REST API.
    #[arg(
        long,
        global = true,
        env = "TRIREME_API",
        default_value = "http://127.0.0.1:7450"
    )]
    pub api: String,

    /// How to print answers: human tables, or the API's JSON.
    #[arg(long, global = true, value_enum, default_value_t = OutputFormat::Table)]
    pub output: OutputFormat,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OutputFormat {
    Table,
    Json,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the node daemon, or ask a running node about itself.
    #[command(subcommand)]
    Node(NodeCommand),
    /// Storage pools: block devices or files that hold volumes.
    #[command(subcommand)]
    Pool(PoolCommand),
    /// Volumes: thin virtual block devices, served over NBD by name.
    #[command(subcommand)]
    Volume(VolumeCommand),
}

#[derive(Debug, Subcommand)]
pub enum NodeCommand {
    /// Run the node daemon in the foreground until SIGTERM or Ctrl-C.
    ///
    /// On first start it creates the default pool: a sparse file in the data
    /// directory of min(64 GiB, 90% of the free space). It prints a line
    /// starting with "trireme node ready" once the API and NBD listen.
    Run(RunArgs),
    /// Show the version and addresses of a running node.
    Info,
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// Where the pool catalog, pool metadata and the default pool live.
    #[arg(long, env = "TRIREME_DATA_DIR", default_value = "/var/lib/trireme")]
    pub data_dir: PathBuf,
    /// TCP address of the NBD server (clients use nbd://ADDRESS/VOLUME).
    #[arg(long, default_value = trireme_node::daemon::DEFAULT_NBD_LISTEN)]
    pub nbd_listen: SocketAddr,
    /// Unix socket of the NBD server [default: DATA_DIR/nbd.sock].
    #[arg(long)]
    pub nbd_socket: Option<PathBuf>,
    /// Address of the REST API.
    #[arg(long, default_value = trireme_node::daemon::DEFAULT_API_LISTEN)]
    pub api_listen: SocketAddr,
    /// Create a 1 GiB volume named `demo` if it is missing, and print how to reach it.
    #[arg(long)]
    pub demo: bool,
}

#[derive(Debug, Subcommand)]
pub enum PoolCommand {
    /// Create a pool on a block device or a file (a missing file is created).
    Create {
        /// Pool name: letters, digits, '-', '_', '.'.
        #[arg(value_parser = parse_pool_name)]
        name: PoolName,
        /// Block device or file; relative paths are taken from the current directory.
        #[arg(long)]
        path: PathBuf,
        /// Size of the file to create, e.g. 100G (binary units); a device's own size otherwise.
        #[arg(long, value_parser = parse_size_argument)]
        size: Option<u64>,
        /// Device class, used by placement.
        #[arg(long, default_value = "ssd", value_parser = parse_device_class)]
        class: DeviceClass,
        /// Reserve the file's space now instead of leaving it sparse.
        #[arg(long)]
        preallocate: bool,
    },
    /// List the pools of the node, with capacity, allocation and provisioning.
    List,
    /// Show one pool.
    Show {
        #[arg(value_parser = parse_pool_name)]
        name: PoolName,
    },
    /// Delete an empty pool and the files it created.
    Delete {
        #[arg(value_parser = parse_pool_name)]
        name: PoolName,
    },
    /// Check a pool: recount its allocation and verify every written block's checksum.
    Scan {
        #[arg(value_parser = parse_pool_name)]
        name: PoolName,
    },
}

#[derive(Debug, Subcommand)]
pub enum VolumeCommand {
    /// Create a thin volume; it takes pool space only as it is written.
    Create {
        /// Volume name, also its NBD export name: letters, digits, '-', '_', '.'.
        #[arg(value_parser = parse_volume_name)]
        name: VolumeName,
        /// Size, e.g. 32G (binary units, a multiple of 4 KiB).
        #[arg(long, value_parser = parse_size_argument)]
        size: u64,
        /// Pool to place it in [default: the online pool with the most free space].
        #[arg(long, value_parser = parse_pool_name)]
        pool: Option<PoolName>,
    },
    /// List volumes: size, allocation, and each pool's provisioning vs capacity.
    List,
    /// Show one volume.
    Show {
        #[arg(value_parser = parse_volume_name)]
        name: VolumeName,
    },
    /// Grow a volume to a new size (volumes never shrink).
    Grow {
        #[arg(value_parser = parse_volume_name)]
        name: VolumeName,
        /// The new total size, e.g. 64G.
        #[arg(long, value_parser = parse_size_argument)]
        size: u64,
    },
    /// Delete a volume and its data. Connected NBD clients get I/O errors.
    Delete {
        #[arg(value_parser = parse_volume_name)]
        name: VolumeName,
    },
}

fn parse_size_argument(text: &str) -> Result<u64, String> {
    parse_size(text).map_err(|error| error.to_string())
}

fn parse_device_class(text: &str) -> Result<DeviceClass, String> {
    text.parse()
}

fn parse_volume_name(text: &str) -> Result<VolumeName, String> {
    VolumeName::new(text).map_err(|error| error.to_string())
}

fn parse_pool_name(text: &str) -> Result<PoolName, String> {
    PoolName::new(text).map_err(|error| error.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    fn parse(words: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("trireme").chain(words.iter().copied()))
    }

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn volume_create_parses_sizes_and_names() {
        let cli = parse(&["volume", "create", "vm1", "--size", "32G", "--pool", "fast"]).unwrap();
        let Command::Volume(VolumeCommand::Create { name, size, pool }) = cli.command else {
            panic!("wrong command: {:?}", cli.command);
        };
        assert_eq!(name.as_str(), "vm1");
        assert_eq!(size, 32 << 30);
        assert_eq!(pool.unwrap().as_str(), "fast");
        assert_eq!(cli.output, OutputFormat::Table);
    }

    #[test]
    fn bad_sizes_and_names_are_refused_with_the_reason() {
        let error = parse(&["volume", "create", "vm1", "--size", "12X"]).unwrap_err();
        assert!(error.to_string().contains("--size"), "{error}");
        assert!(error.to_string().contains("size '12X' is not"), "{error}");
        let error = parse(&["volume", "create", "a/b", "--size", "1G"]).unwrap_err();
        assert!(error.to_string().contains("volume name 'a/b'"), "{error}");
        let error = parse(&["pool", "create", "p", "--path", "/x", "--class", "tape"]).unwrap_err();
        assert!(error.to_string().contains("nvme, ssd or hdd"), "{error}");
        assert!(
            parse(&["volume", "create", "vm1"]).is_err(),
            "--size is required"
        );
    }

    #[test]
    fn global_options_go_anywhere() {
        let cli = parse(&["volume", "list", "--output", "json", "--api", "http://h:1"]).unwrap();
        assert_eq!(cli.output, OutputFormat::Json);
        assert_eq!(cli.api, "http://h:1");
    }

    #[test]
    fn node_run_has_defaults() {
        let cli = parse(&["node", "run", "--data-dir", "/tmp/x", "--demo"]).unwrap();
        let Command::Node(NodeCommand::Run(run)) = cli.command else {
            panic!("wrong command");
        };
        assert!(run.demo);
        assert_eq!(run.nbd_listen.port(), 10809);
        assert_eq!(run.api_listen.port(), 7450);
        assert_eq!(run.nbd_socket, None);
    }

    #[test]
    fn pool_create_defaults_to_ssd() {
        let cli = parse(&[
            "pool",
            "create",
            "p",
            "--path",
            "/tmp/p.img",
            "--size",
            "100G",
        ])
        .unwrap();
        let Command::Pool(PoolCommand::Create {
            class,
            size,
            preallocate,
            ..
        }) = cli.command
        else {
            panic!("wrong command");
        };
        assert_eq!(class, DeviceClass::Ssd);
        assert_eq!(size, Some(100 << 30));
        assert!(!preallocate);
    }
}
