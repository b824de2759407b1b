//! Crash durability: a checker writes self-describing 4 KiB blocks (single
//! and multi-block writes, and WRITE_ZEROES) over several NBD connections,
//! records exactly which writes were acknowledged as durable (FUA, or
//! acknowledged before an acknowledged FLUSH on the same connection), and the
//! node is SIGKILLed mid-load after a random delay. After a restart every
//! block must hold its latest durable content or a later one the checker
//! sent, whole (never torn within a 4 KiB block), and `pool scan` must be
//! clean. Three crash cycles, then a clean stop and start.

mod common;

use common::nbd_client::{decode, pattern, NbdClient};
use common::*;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const BLOCKS: u64 = 2048; // 8 MiB written area
const THREADS: u64 = 4;
const CYCLES: u64 = 3;

#[derive(Clone, Debug, Default)]
struct BlockModel {
    /// Contents sent for this block since the last verified baseline, in
    /// order: a generation, or 0 for zeroes (WRITE_ZEROES). The baseline
    /// itself is first.
    sent: Vec<u64>,
    /// Index in `sent` of the latest content known durable.
    durable: usize,
}

struct LoadStats {
    writes_sent: u64,
    writes_acked: u64,
    durable: u64,
    flushes: u64,
    end: String,
}

struct Load {
    port: u16,
    lo: u64,
    hi: u64,
    cycle: u64,
    seed: u64,
}

/// One thread's load on its own range of blocks [lo, hi): single-block and
/// multi-block writes and WRITE_ZEROES, half with FUA, a FLUSH every 8 ops.
fn load(
    p: Load,
    mut model: HashMap<u64, BlockModel>,
    stop: Arc<AtomicBool>,
) -> (HashMap<u64, BlockModel>, LoadStats) {
    let mut st = LoadStats {
        writes_sent: 0,
        writes_acked: 0,
        durable: 0,
        flushes: 0,
        end: String::new(),
    };
    let mut c = match NbdClient::connect(p.port, "crash") {
        Ok(c) => c,
        Err(e) => {
            st.end = format!("connect failed: {e}");
            return (model, st);
        }
    };
    let mut rng = Rng::new(p.seed);
    // (block, index in sent) acknowledged but not yet durable.
    let mut pending: Vec<(u64, usize)> = Vec::new();
    let mut pending_ops = 0u64;
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut i: u64 = 0;
    while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
        i += 1;
        let kind = rng.below(10);
        let n = if kind < 6 { 1 } else { 2 + rng.below(15) };
        let first = p.lo + rng.below(p.hi - p.lo - n + 1);
        let zeroes = kind == 9;
        let fua = rng.below(2) == 0;
        let mut data = Vec::with_capacity((n * 4096) as usize);
        let mut idx = Vec::with_capacity(n as usize);
        for b in first..first + n {
            let gen = if zeroes {
                0
            } else {
                (p.cycle + 1) * 100_000_000 + i * 16 + (b - first)
            };
            if !zeroes {
                data.extend_from_slice(&pattern(b, gen));
            }
            let m = model.get_mut(&b).unwrap();
            m.sent.push(gen);
            idx.push((b, m.sent.len() - 1));
        }
        st.writes_sent += 1;
        let r = if zeroes {
            c.write_zeroes(first * 4096, (n * 4096) as u32, fua)
        } else {
            c.write(first * 4096, &data, fua)
        };
        match r {
            Ok(()) => {
                st.writes_acked += 1;
                if fua {
                    for (b, k) in idx {
                        let m = model.get_mut(&b).unwrap();
                        m.durable = m.durable.max(k);
                    }
                    st.durable += 1;
                } else {
                    pending.extend(idx);
                    pending_ops += 1;
                }
            }
            Err(e) => {
                st.end = format!("write: {e}");
                break;
            }
        }
        if i.is_multiple_of(8) {
            match c.flush() {
                Ok(()) => {
                    st.flushes += 1;
                    st.durable += std::mem::take(&mut pending_ops);
                    for (b, k) in pending.drain(..) {
                        let m = model.get_mut(&b).unwrap();
                        m.durable = m.durable.max(k);
                    }
                }
                Err(e) => {
                    st.end = format!("flush: {e}");
                    break;
                }
            }
        }
    }
    if st.end.is_empty() {
        st.end = "stopped".into();
    }
    (model, st)
}

fn tail(v: &[u64]) -> &[u64] {
    &v[v.len().saturating_sub(6)..]
}

/// Read every block back and check it against the model; returns the new
/// baseline (each block's observed content).
fn verify(node: &TestNode, model: &HashMap<u64, BlockModel>) -> HashMap<u64, BlockModel> {
    let mut c = NbdClient::connect(node.nbd_port, "crash").expect("connect after restart");
    let mut bad = Vec::new();
    let mut next = HashMap::new();
    for b in 0..BLOCKS {
        let m = &model[&b];
        let buf = match c.read(b * 4096, 4096) {
            Ok(buf) => buf,
            Err(e) => {
                bad.push(format!("block {b}: read error {e}; model {m:?}"));
                continue;
            }
        };
        let g = match decode(&buf) {
            None => {
                bad.push(format!(
                    "block {b}: torn or garbage content (first bytes {:?}); latest durable {} sent {:?}",
                    &buf[..24],
                    m.sent[m.durable],
                    tail(&m.sent)
                ));
                continue;
            }
            Some((_, 0)) => 0,
            Some((bb, g)) if bb != b => {
                bad.push(format!(
                    "block {b}: holds block {bb}'s data (gen {g}): misdirected write"
                ));
                continue;
            }
            Some((_, g)) => g,
        };
        // Allowed: the latest durable content or anything sent after it.
        if !m.sent[m.durable..].contains(&g) {
            bad.push(format!(
                "block {b}: reads generation {g} (0 = zeroes), but the latest durable is {} (sent, newest last: {:?})",
                m.sent[m.durable],
                tail(&m.sent)
            ));
        }
        next.insert(
            b,
            BlockModel {
                sent: vec![g],
                durable: 0,
            },
        );
    }
    assert!(
        bad.is_empty(),
        "{} of {BLOCKS} blocks violate durability:\n{}",
        bad.len(),
        bad.iter().take(20).cloned().collect::<Vec<_>>().join("\n")
    );
    next
}

#[test]
fn kill9_mid_load_keeps_every_durable_write() {
    let mut rng = Rng::from_env_or_time("crash test");
    let mut node = TestNode::start();
    node.create_volume("crash", "16M");
    let mut model: HashMap<u64, BlockModel> = (0..BLOCKS)
        .map(|b| {
            (
                b,
                BlockModel {
                    sent: vec![0],
                    durable: 0,
                },
            )
        })
        .collect();
    let per = BLOCKS / THREADS;

    for cycle in 0..CYCLES {
        let stop = Arc::new(AtomicBool::new(false));
        let mut handles = Vec::new();
        for t in 0..THREADS {
            let (lo, hi) = (t * per, (t + 1) * per);
            let part: HashMap<u64, BlockModel> = model
                .iter()
                .filter(|(b, _)| (lo..hi).contains(*b))
                .map(|(b, m)| (*b, m.clone()))
                .collect();
            let stop = stop.clone();
            let p = Load {
                port: node.nbd_port,
                lo,
                hi,
                cycle,
                seed: rng.next_u64(),
            };
            handles.push(std::thread::spawn(move || load(p, part, stop)));
        }
        let delay = Duration::from_millis(300 + rng.below(1200));
        std::thread::sleep(delay);
        node.kill9();
        stop.store(true, Ordering::Relaxed);
        let mut totals = (0, 0, 0, 0);
        for h in handles {
            let (part, st) = h.join().expect("load thread panicked");
            eprintln!(
                "cycle {cycle}: thread sent {} acked {} durable {} flushes {} ({})",
                st.writes_sent, st.writes_acked, st.durable, st.flushes, st.end
            );
            totals.0 += st.writes_sent;
            totals.1 += st.writes_acked;
            totals.2 += st.durable;
            totals.3 += st.flushes;
            model.extend(part);
        }
        eprintln!(
            "cycle {cycle}: killed after {delay:?}; sent {} acked {} durable {} flushes {}",
            totals.0, totals.1, totals.2, totals.3
        );
        assert!(
            totals.2 > 0,
            "no write became durable before the kill: the test proved nothing"
        );

        node.restart();
        model = verify(&node, &model);
        node.assert_scan_clean("default");
        node.assert_healthy();
    }
    // After the last crash, a clean stop and start changes nothing.
    node.stop();
    node.restart();
    model = verify(&node, &model);
    node.assert_scan_clean("default");
    let written = model.values().filter(|m| m.sent[0] != 0).count();
    eprintln!("{written} of {BLOCKS} blocks hold data at the end");
}

/// The export advertises multi-conn: a FLUSH acknowledged on one connection
/// makes the writes completed on every other connection durable too. Writer
/// connections write without FUA, a separate connection flushes, the node is
/// killed right after the flush's acknowledgement; all those writes survive.
#[test]
fn flush_on_one_connection_covers_writes_on_others() {
    let mut node = TestNode::start();
    node.create_volume("mc", "8M");
    for round in 0..3u64 {
        let mut writers: Vec<NbdClient> = (0..3)
            .map(|_| NbdClient::connect(node.nbd_port, "mc").unwrap())
            .collect();
        let mut flusher = NbdClient::connect(node.nbd_port, "mc").unwrap();
        assert!(
            flusher.flags & common::nbd_client::TF_CAN_MULTI_CONN != 0,
            "export does not advertise multi-conn (flags {:#x})",
            flusher.flags
        );
        let gen = round + 1;
        for b in 0..192u64 {
            let w = &mut writers[(b % 3) as usize];
            w.write(b * 4096, &pattern(b, gen), false).unwrap();
        }
        flusher.flush().unwrap();
        node.kill9();
        drop(writers);
        node.restart();
        let mut c = NbdClient::connect(node.nbd_port, "mc").unwrap();
        for b in 0..192u64 {
            let got = c.read(b * 4096, 4096).unwrap();
            assert_eq!(
                decode(&got),
                Some((b, gen)),
                "round {round}: block {b} written on connection {} before a FLUSH acknowledged on another connection was lost",
                b % 3
            );
        }
        c.disconnect();
    }
    node.assert_scan_clean("default");
}
