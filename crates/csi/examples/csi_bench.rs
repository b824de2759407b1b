//! The client of bench/csi.sh: drives a running `trireme-csi` over its unix
//! socket the way Kubernetes does for a pod's new volume (CreateVolume,
//! ControllerPublishVolume, NodeStageVolume, NodePublishVolume) and back
//! (NodeUnpublishVolume, NodeUnstageVolume, ControllerUnpublishVolume,
//! DeleteVolume), in waves of `--parallel` volumes at once, and prints one
//! line per measurement for the script to summarise:
//!
//! ```text
//! mounted WAVE VOLUME TOTAL_MS CREATE_MS ATTACH_MS STAGE_MS PUBLISH_MS
//! deleted WAVE VOLUME DELETE_MS
//! freed   WAVE MS
//! ```
//!
//! `mounted` ends when NodePublishVolume answers and the target is a mount
//! of an ext4 file system; `freed` is the time from the wave's first
//! DeleteVolume until the pools of every `--api` node hold no more
//! allocated bytes than before the wave's first CreateVolume.

use anyhow::{bail, Context, Result};
use clap::Parser;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use trireme_csi::csi::controller_client::ControllerClient;
use trireme_csi::csi::node_client::NodeClient;
use trireme_csi::csi::volume_capability::MountVolume;
use trireme_csi::csi::volume_capability::{access_mode::Mode, AccessMode, AccessType};
use trireme_csi::csi::*;

/// How long the pools may take to give a wave's space back.
const FREED_WAIT: Duration = Duration::from_secs(60);

#[derive(Debug, Parser)]
struct Args {
    /// The driver's unix socket.
    #[arg(long)]
    socket: PathBuf,
    /// The CSI node id (trireme node name) the node plugin serves.
    #[arg(long)]
    node: String,
    /// Where the staging and target paths go.
    #[arg(long)]
    dir: PathBuf,
    /// Every node's API (comma-separated), for the pools' allocated bytes.
    #[arg(long)]
    api: String,
    /// Volumes in all.
    #[arg(long, default_value_t = 100)]
    count: usize,
    /// Volumes at once (a wave).
    #[arg(long, default_value_t = 1)]
    parallel: usize,
    /// Each volume's size in MiB.
    #[arg(long, default_value_t = 64)]
    size_mib: i64,
    /// Prefix of the volumes' CSI names.
    #[arg(long, default_value = "bench")]
    prefix: String,
}

async fn channel(socket: &Path) -> Result<tonic::transport::Channel> {
    let path = socket.to_path_buf();
    tonic::transport::Endpoint::try_from("http://[::1]:1")?
        .connect_with_connector(tower::service_fn(move |_| {
            let path = path.clone();
            async move {
                let stream = tokio::net::UnixStream::connect(path).await?;
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
            }
        }))
        .await
        .with_context(|| format!("connecting to {}", socket.display()))
}

fn capability() -> VolumeCapability {
    VolumeCapability {
        access_type: Some(AccessType::Mount(MountVolume {
            fs_type: "ext4".into(),
            ..Default::default()
        })),
        access_mode: Some(AccessMode {
            mode: Mode::SingleNodeWriter as i32,
        }),
    }
}

struct Bench {
    args: Args,
    channel: tonic::transport::Channel,
    http: reqwest::Client,
}

struct Mounted {
    id: String,
    staging: PathBuf,
    target: PathBuf,
}

impl Bench {
    fn ms(since: Instant) -> f64 {
        since.elapsed().as_secs_f64() * 1000.0
    }

    /// CreateVolume to a mounted file system; prints the `mounted` line.
    async fn up(&self, wave: usize, index: usize) -> Result<Mounted> {
        let mut controller = ControllerClient::new(self.channel.clone());
        let mut node = NodeClient::new(self.channel.clone());
        let name = format!("{}-{index}", self.args.prefix);
        let staging = self.args.dir.join(format!("{name}-staging"));
        let target = self.args.dir.join(format!("{name}-target"));
        std::fs::create_dir_all(&staging)?;
        let started = Instant::now();
        let created = controller
            .create_volume(CreateVolumeRequest {
                name: name.clone(),
                capacity_range: Some(CapacityRange {
                    required_bytes: self.args.size_mib << 20,
                    limit_bytes: 0,
                }),
                volume_capabilities: vec![capability()],
                ..Default::default()
            })
            .await
            .with_context(|| format!("CreateVolume {name}"))?
            .into_inner();
        let id = created
            .volume
            .context("CreateVolume answered no volume")?
            .volume_id;
        let create_ms = Self::ms(started);
        let step = Instant::now();
        let published = controller
            .controller_publish_volume(ControllerPublishVolumeRequest {
                volume_id: id.clone(),
                node_id: self.args.node.clone(),
                volume_capability: Some(capability()),
                ..Default::default()
            })
            .await
            .with_context(|| format!("ControllerPublishVolume {id}"))?
            .into_inner();
        let attach_ms = Self::ms(step);
        let step = Instant::now();
        node.node_stage_volume(NodeStageVolumeRequest {
            volume_id: id.clone(),
            publish_context: published.publish_context.clone(),
            staging_target_path: staging.display().to_string(),
            volume_capability: Some(capability()),
            ..Default::default()
        })
        .await
        .with_context(|| format!("NodeStageVolume {id}"))?;
        let stage_ms = Self::ms(step);
        let step = Instant::now();
        node.node_publish_volume(NodePublishVolumeRequest {
            volume_id: id.clone(),
            publish_context: published.publish_context,
            staging_target_path: staging.display().to_string(),
            target_path: target.display().to_string(),
            volume_capability: Some(capability()),
            ..Default::default()
        })
        .await
        .with_context(|| format!("NodePublishVolume {id}"))?;
        let publish_ms = Self::ms(step);
        let total_ms = Self::ms(started);
        match trireme_host::mount_at(&target).map(|mount| mount.fs_type) {
            Some(kind) if kind == "ext4" => {}
            other => bail!(
                "{} is not an ext4 mount after NodePublishVolume: {other:?}",
                target.display()
            ),
        }
        println!(
            "mounted {wave} {index} {total_ms:.1} {create_ms:.1} {attach_ms:.1} {stage_ms:.1} {publish_ms:.1}"
        );
        Ok(Mounted {
            id,
            staging,
            target,
        })
    }

    /// Unpublish, unstage, detach: what Kubernetes does when the pod ends.
    async fn down(&self, volume: &Mounted) -> Result<()> {
        let mut controller = ControllerClient::new(self.channel.clone());
        let mut node = NodeClient::new(self.channel.clone());
        node.node_unpublish_volume(NodeUnpublishVolumeRequest {
            volume_id: volume.id.clone(),
            target_path: volume.target.display().to_string(),
        })
        .await
        .with_context(|| format!("NodeUnpublishVolume {}", volume.id))?;
        node.node_unstage_volume(NodeUnstageVolumeRequest {
            volume_id: volume.id.clone(),
            staging_target_path: volume.staging.display().to_string(),
        })
        .await
        .with_context(|| format!("NodeUnstageVolume {}", volume.id))?;
        controller
            .controller_unpublish_volume(ControllerUnpublishVolumeRequest {
                volume_id: volume.id.clone(),
                node_id: self.args.node.clone(),
                ..Default::default()
            })
            .await
            .with_context(|| format!("ControllerUnpublishVolume {}", volume.id))?;
        let _ = std::fs::remove_dir(&volume.staging);
        Ok(())
    }

    async fn delete(&self, wave: usize, index: usize, id: &str) -> Result<()> {
        let mut controller = ControllerClient::new(self.channel.clone());
        let started = Instant::now();
        controller
            .delete_volume(DeleteVolumeRequest {
                volume_id: id.to_string(),
                ..Default::default()
            })
            .await
            .with_context(|| format!("DeleteVolume {id}"))?;
        println!("deleted {wave} {index} {:.1}", Self::ms(started));
        Ok(())
    }

    /// Allocated bytes of every node's pools (each node's own /pools).
    async fn allocated(&self) -> Result<u64> {
        let mut sum = 0;
        for base in self.args.api.split(',') {
            let url = format!("{}/api/v1/pools", base.trim_end_matches('/'));
            let pools: Vec<serde_json::Value> = self
                .http
                .get(&url)
                .send()
                .await
                .and_then(|response| response.error_for_status())
                .with_context(|| format!("GET {url}"))?
                .json()
                .await
                .with_context(|| format!("GET {url}: not JSON"))?;
            sum += pools
                .iter()
                .filter_map(|pool| pool["allocated_bytes"].as_u64())
                .sum::<u64>();
        }
        Ok(sum)
    }

    async fn wave(&self, wave: usize, indexes: &[usize]) -> Result<()> {
        let before = self.allocated().await?;
        let ups = indexes.iter().map(|index| self.up(wave, *index));
        let mounted: Vec<Mounted> = futures_all(ups).await?;
        let downs = mounted.iter().map(|volume| self.down(volume));
        futures_all(downs).await?;
        let started = Instant::now();
        let deletes = mounted
            .iter()
            .zip(indexes)
            .map(|(volume, index)| self.delete(wave, *index, &volume.id));
        futures_all(deletes).await?;
        loop {
            let now = self.allocated().await?;
            if now <= before {
                break;
            }
            if started.elapsed() > FREED_WAIT {
                bail!(
                    "wave {wave}: the pools still hold {} bytes more than before it, {} s after \
                     its DeleteVolume calls",
                    now - before,
                    FREED_WAIT.as_secs()
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        println!("freed {wave} {:.1}", Self::ms(started));
        Ok(())
    }
}

/// Runs futures at once on this task; the first error wins.
async fn futures_all<T>(
    futures: impl Iterator<Item = impl std::future::Future<Output = Result<T>>>,
) -> Result<Vec<T>> {
    let mut set = Vec::new();
    for future in futures {
        set.push(Box::pin(future));
    }
    let mut out = Vec::new();
    for result in join_all(set).await {
        out.push(result?);
    }
    Ok(out)
}

/// A minimal join_all (the crate does not depend on `futures`).
async fn join_all<F: std::future::Future + Unpin>(mut futures: Vec<F>) -> Vec<F::Output> {
    let mut outputs: Vec<Option<F::Output>> = futures.iter().map(|_| None).collect();
    std::future::poll_fn(|context| {
        let mut pending = false;
        for (future, output) in futures.iter_mut().zip(outputs.iter_mut()) {
            if output.is_none() {
                match std::pin::Pin::new(future).poll(context) {
                    std::task::Poll::Ready(value) => *output = Some(value),
                    std::task::Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(())
        }
    })
    .await;
    outputs.into_iter().map(Option::unwrap).collect()
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<()> {
    let args = Args::parse();
    if args.parallel == 0 || args.count == 0 {
        bail!("--count and --parallel must be at least 1");
    }
    std::fs::create_dir_all(&args.dir)?;
    let channel = channel(&args.socket).await?;
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()?;
    let bench = Bench {
        args,
        channel,
        http,
    };
    let indexes: Vec<usize> = (1..=bench.args.count).collect();
    for (wave, chunk) in indexes.chunks(bench.args.parallel).enumerate() {
        bench.wave(wave + 1, chunk).await?;
    }
    Ok(())
}
