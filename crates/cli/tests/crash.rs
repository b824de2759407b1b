//! Crash durability: a checker writes self-describing 4 KiB blocks over
//! several NBD connections, records exactly which writes were acknowledged as
//! durable (FUA, or acknowledged before an acknowledged FLUSH), and the node
//! is SIGKILLed mid-load after a random delay. After a restart every block
//! must hold its latest durable generation or a later one the checker sent,
//! whole (never torn), and `pool scan` must be clean.

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
    /// Generations sent for this block since the last verified baseline, in
    /// order (the baseline itself first).
    sent: Vec<u64>,
    /// Latest generation known durable (0 = zeroes / never written).
    durable: u64,
}

struct LoadStats {
    writes_sent: u64,
    writes_acked: u64,
    durable: u64,
    flushes: u64,
    end: String,
}

fn load(
    port: u16,
    vol: &str,
    t: u64,
    cycle: u64,
    mut model: HashMap<u64, BlockModel>,
    stop: Arc<AtomicBool>,
    seed: u64,
) -> (HashMap<u64, BlockModel>, LoadStats) {
    let mut st = LoadStats {
        writes_sent: 0,
        writes_acked: 0,
        durable: 0,
        flushes: 0,
        end: String::new(),
    };
    let mut c = match NbdClient::connect(port, vol) {
        Ok(c) => c,
        Err(e) => {
            st.end = format!("connect failed: {e}");
            return (model, st);
        }
    };
    let mut rng = Rng::new(seed);
    let owned: Vec<u64> = (0..BLOCKS).filter(|b| b % THREADS == t).collect();
    let mut pending: Vec<(u64, u64)> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut i: u64 = 0;
    while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
        let b = owned[rng.below(owned.len() as u64) as usize];
        i += 1;
        let gen = (cycle + 1) * 10_000_000 + i;
        let fua = rng.below(2) == 0;
        model.get_mut(&b).unwrap().sent.push(gen);
        st.writes_sent += 1;
        match c.write(b * 4096, &pattern(b, gen), fua) {
            Ok(()) => {
                st.writes_acked += 1;
                if fua {
                    let m = model.get_mut(&b).unwrap();
                    m.durable = m.durable.max(gen);
                    st.durable += 1;
                } else {
                    pending.push((b, gen));
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
                    for (b, g) in pending.drain(..) {
                        let m = model.get_mut(&b).unwrap();
                        m.durable = m.durable.max(g);
                        st.durable += 1;
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

/// Read every block back and check it against the model; returns the new
/// baseline (each block's observed generation).
fn verify(
    node: &TestNode,
    vol: &str,
    model: &HashMap<u64, BlockModel>,
) -> HashMap<u64, BlockModel> {
    let mut c = NbdClient::connect(node.nbd_port, vol).expect("connect after restart");
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
                    "block {b}: torn or garbage content (first bytes {:?}); model durable {} sent {:?}",
                    &buf[..24],
                    m.durable,
                    tail(&m.sent)
                ));
                continue;
            }
            Some((_, 0)) => 0,
            Some((bb, g)) => {
                if bb != b {
                    bad.push(format!(
                        "block {b}: holds block {bb}'s data (gen {g}), misdirected write"
                    ));
                    continue;
                }
                g
            }
        };
        let ok = if g == 0 {
            m.durable == 0
        } else {
            g >= m.durable && m.sent.contains(&g)
        };
        if !ok {
            bad.push(format!(
                "block {b}: reads generation {g}, but latest durable is {} (sent, newest last: {:?})",
                m.durable,
                tail(&m.sent)
            ));
        }
        next.insert(
            b,
            BlockModel {
                sent: vec![g],
                durable: g,
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

fn tail(v: &[u64]) -> &[u64] {
    &v[v.len().saturating_sub(6)..]
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

    for cycle in 0..CYCLES {
        let stop = Arc::new(AtomicBool::new(false));
        let mut handles = Vec::new();
        for t in 0..THREADS {
            let part: HashMap<u64, BlockModel> = model
                .iter()
                .filter(|(b, _)| *b % THREADS == t)
                .map(|(b, m)| (*b, m.clone()))
                .collect();
            let stop = stop.clone();
            let port = node.nbd_port;
            let seed = rng.next_u64();
            handles.push(std::thread::spawn(move || {
                load(port, "crash", t, cycle, part, stop, seed)
            }));
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
        model = verify(&node, "crash", &model);
        node.assert_scan_clean("default");
        node.assert_healthy();
    }
    // After the last crash, a clean stop and start changes nothing.
    node.stop();
    node.restart();
    model = verify(&node, "crash", &model);
    node.assert_scan_clean("default");
    let written = model.values().filter(|m| m.durable > 0).count();
    eprintln!("{written} of {BLOCKS} blocks hold data at the end");
}
