//! The autoplacer: which nodes and pools a volume's replicas go to.
//!
//! [`place`] is a pure function of its inputs. It reads no clock, no random
//! source and no global state, so the Raft leader can run it and every
//! follower that replays the same inputs gets the same answer.
//!
//! Rules, in the order they apply:
//!
//! - A node can take a diskful replica when it is online, not evicted, not in
//!   `exclude`, not already holding one of the `keep` replicas, has every
//!   label key of `replicas_on_different`, and has a qualifying pool.
//! - A pool qualifies by its name (when `pools` is non-empty) and its device
//!   class (when `class` is set) only. Volumes are thin and over-commit is
//!   allowed, so neither capacity nor free space rules a pool out; free space
//!   only steers the choice. On each node the pool with the most free bytes is
//!   used (ties: the lowest name).
//! - No two diskful replicas, kept ones included, may share a value of any
//!   `replicas_on_different` key. The placer places as many replicas as the
//!   constraints allow, up to `place_count`, and refuses when that is fewer
//!   than `min_place_count`. A small backtracking search makes this exact:
//!   whenever a valid set of k nodes exists, one is found (see
//!   [`SEARCH_BUDGET`] for the bound on its work).
//! - Among valid sets, nodes are preferred by weighted rendezvous hashing on
//!   the free bytes of their chosen pool, keyed by `seed`. A node with twice
//!   the free space is twice as likely to come first, and different volumes
//!   (different seeds) spread over the cluster instead of piling onto the
//!   emptiest node: with thin volumes free space does not drop at placement
//!   time, so a plain "most free first" would send every volume to the same
//!   nodes. The ranking uses integer arithmetic only, so it is identical on
//!   every platform, and does not depend on the order of `candidates`.
//! - With `manual_nodes`, exactly those nodes get the new diskful replicas;
//!   `place_count` and `min_place_count` are ignored, but every other rule is
//!   checked and a violation refused rather than repaired.
//! - When the number of diskful replicas is even, one more online, non-evicted
//!   node (it needs no pool) becomes a diskless tiebreaker, so that a
//!   partition into two halves still has a quorum side. A node whose labels
//!   differ from every diskful replica's is preferred, since a tiebreaker in a
//!   replica's zone fails together with it.
//! - With `diskless_on_remaining`, every other online, non-evicted node
//!   becomes a diskless member.
//!
//! Every refusal is a [`PlacementError`] whose one-line text says what was
//! needed, what was found and why the other nodes were left out.

use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};
use trireme_types::{DeviceClass, NodeId, NodeName, PoolName};

/// The most search steps one placement may take. A step visits one partial
/// set of mutually compatible nodes, and a cluster of n nodes has at most
/// 2^n such sets, so for up to 17 nodes the search is exhaustive whatever the
/// labels. Past that the search may stop early with the largest set seen so
/// far; with realistic label layouts it finishes long before.
pub const SEARCH_BUDGET: usize = 1 << 17;

/// A node as the placer sees it.
#[derive(Debug, Clone)]
pub struct Candidate {
    pub id: NodeId,
    pub name: NodeName,
    pub labels: BTreeMap<String, String>,
    pub online: bool,
    pub evicted: bool,
    pub pools: Vec<CandidatePool>,
}

/// One storage pool of a [`Candidate`].
#[derive(Debug, Clone)]
pub struct CandidatePool {
    pub name: PoolName,
    pub class: DeviceClass,
    pub capacity_bytes: u64,
    pub free_bytes: u64,
}

/// What to place, and under which constraints.
#[derive(Debug, Clone)]
pub struct Request<'a> {
    pub size_bytes: u64,
    /// Wanted diskful replicas, `keep` included (at least 1).
    pub place_count: usize,
    /// Fewest diskful replicas accepted, `keep` included
    /// (1..=`place_count`). The default group uses 1 so that a one-node
    /// cluster can still create volumes.
    pub min_place_count: usize,
    /// When non-empty, only pools with one of these names qualify.
    pub pools: &'a [PoolName],
    /// When set, only pools of this class qualify.
    pub class: Option<DeviceClass>,
    /// Label keys on which every two diskful replicas must differ. A node
    /// without one of these keys cannot take a diskful replica.
    pub replicas_on_different: &'a [String],
    /// Make every other online, non-evicted node a diskless member.
    pub diskless_on_remaining: bool,
    /// `--nodes a,b,c`: exactly these nodes get the new diskful replicas.
    pub manual_nodes: Option<&'a [NodeName]>,
    /// Nodes that must not get a diskful replica.
    pub exclude: &'a [NodeId],
    /// Diskful replicas that stay where they are (re-placement after an
    /// eviction). They count toward `place_count` and constrain labels.
    pub keep: &'a [(NodeId, PoolName)],
    /// Spreads volumes and breaks ties, e.g. a hash of the volume name.
    pub seed: u64,
}

/// Where a volume's replicas go.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Placement {
    /// The `keep` entries first, in their given order, then the new ones.
    pub diskful: Vec<(NodeId, PoolName)>,
    /// A diskless node added when `diskful` has an even length.
    pub tiebreaker: Option<NodeId>,
    /// Further diskless members, by id; never holds the tiebreaker.
    pub diskless: Vec<NodeId>,
}

/// Why a volume cannot be placed. Every variant's text is one line that says
/// what to change.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlacementError {
    #[error("invalid placement request: {reason}")]
    InvalidRequest { reason: String },
    /// Fewer than `min_place_count` replicas fit. `found` lists the best set
    /// the search found (kept replicas marked), `left_out` why each other node
    /// was not used.
    #[error("{}", not_enough_text(*.place_count, *.needed, .requirement, .found, .left_out))]
    NotEnoughNodes {
        place_count: usize,
        needed: usize,
        requirement: String,
        found: Vec<String>,
        left_out: Vec<String>,
    },
    #[error("node {name} is not a member of the cluster")]
    UnknownNode { name: NodeName },
    #[error("node {name} is listed twice")]
    DuplicateNode { name: NodeName },
    #[error("node {name} cannot take a replica: it {reason}")]
    NodeUnusable { name: NodeName, reason: String },
    #[error("nodes {first} and {second} share {key}={value}; replicas must be on different {key} values")]
    LabelConflict {
        first: NodeName,
        second: NodeName,
        key: String,
        value: String,
    },
}

fn not_enough_text(
    place_count: usize,
    needed: usize,
    requirement: &str,
    found: &[String],
    left_out: &[String],
) -> String {
    let at_least = if needed < place_count {
        "at least "
    } else {
        ""
    };
    let mut text = format!(
        "place-count {place_count} needs {at_least}{needed} {requirement}; found {}",
        found.len()
    );
    if !found.is_empty() {
        text.push_str(": ");
        text.push_str(&found.join(", "));
    }
    if !left_out.is_empty() {
        text.push_str(&format!(" ({})", left_out.join(", ")));
    }
    text
}

/// Places a volume's replicas; see the module documentation for the rules.
pub fn place(candidates: &[Candidate], request: &Request) -> Result<Placement, PlacementError> {
    let keys = distinct_keys(request.replicas_on_different);
    let by_id: BTreeMap<NodeId, &Candidate> = candidates.iter().map(|c| (c.id, c)).collect();
    let kept = kept_nodes(&by_id, request.keep)?;
    let context = Context {
        request,
        keys: &keys,
        kept_ids: kept.iter().map(|c| c.id).collect(),
    };

    let new_nodes: Vec<(NodeId, PoolName)> = match request.manual_nodes {
        Some(names) => place_manually(candidates, &context, &kept, names)?,
        None => place_automatically(candidates, &context, &kept)?,
    };

    let mut diskful: Vec<(NodeId, PoolName)> = request.keep.to_vec();
    diskful.extend(new_nodes);
    let diskful_ids: BTreeSet<NodeId> = diskful.iter().map(|(id, _)| *id).collect();
    let diskful_nodes: Vec<&Candidate> = diskful_ids.iter().map(|id| by_id[id]).collect();

    // Diskless members need no pool and no labels: they only vote and
    // forward I/O, and `exclude` only bars a node from holding data.
    let diskless_eligible: Vec<&Candidate> = by_id
        .values()
        .filter(|c| c.online && !c.evicted && !diskful_ids.contains(&c.id))
        .copied()
        .collect();

    let tiebreaker = if diskful.len().is_multiple_of(2) {
        choose_tiebreaker(&diskless_eligible, &diskful_nodes, &keys, request.seed)
    } else {
        None
    };
    let diskless = if request.diskless_on_remaining {
        diskless_eligible
            .iter()
            .map(|c| c.id)
            .filter(|id| Some(*id) != tiebreaker)
            .collect()
    } else {
        Vec::new()
    };

    Ok(Placement {
        diskful,
        tiebreaker,
        diskless,
    })
}

/// What every step of one placement needs to know.
struct Context<'r, 'a> {
    request: &'r Request<'a>,
    keys: &'r [&'r str],
    kept_ids: BTreeSet<NodeId>,
}

/// A node that may take a diskful replica.
struct Fit<'c> {
    node: &'c Candidate,
    pool: &'c CandidatePool,
    /// The node's value of each constrained key, in `keys` order.
    values: Vec<&'c str>,
}

// A repeated key would only repeat the same check and clutter messages.
fn distinct_keys(keys: &[String]) -> Vec<&str> {
    let mut seen = BTreeSet::new();
    keys.iter()
        .map(String::as_str)
        .filter(|key| seen.insert(*key))
        .collect()
}

fn kept_nodes<'c>(
    by_id: &BTreeMap<NodeId, &'c Candidate>,
    keep: &[(NodeId, PoolName)],
) -> Result<Vec<&'c Candidate>, PlacementError> {
    let mut seen = BTreeSet::new();
    let mut kept = Vec::with_capacity(keep.len());
    for (id, pool) in keep {
        // Without the node its labels are unknown, and the label rules
        // could not be checked against it.
        let node = by_id.get(id).ok_or_else(|| PlacementError::InvalidRequest {
            reason: format!("the kept replica in pool {pool} is on node id {id}, which is not a member of the cluster"),
        })?;
        if !seen.insert(*id) {
            return Err(PlacementError::InvalidRequest {
                reason: format!(
                    "node {} holds two kept replicas; a node holds at most one",
                    node.name
                ),
            });
        }
        kept.push(*node);
    }
    Ok(kept)
}

fn pool_qualifies(pool: &CandidatePool, request: &Request) -> bool {
    (request.pools.is_empty() || request.pools.contains(&pool.name))
        && request.class.is_none_or(|class| pool.class == class)
}

fn best_pool<'c>(node: &'c Candidate, request: &Request) -> Option<&'c CandidatePool> {
    node.pools
        .iter()
        .filter(|pool| pool_qualifies(pool, request))
        .min_by(|a, b| {
            b.free_bytes
                .cmp(&a.free_bytes)
                .then_with(|| a.name.cmp(&b.name))
        })
}

/// Checks one node for a diskful replica. The error is a verb phrase that
/// follows the node's name: "is offline", "has no nvme pool".
fn assess<'c>(node: &'c Candidate, context: &Context) -> Result<Fit<'c>, String> {
    let request = context.request;
    if node.evicted {
        return Err("is evicted".to_string());
    }
    if !node.online {
        return Err("is offline".to_string());
    }
    if context.kept_ids.contains(&node.id) {
        return Err("already holds a replica of this volume".to_string());
    }
    if request.exclude.contains(&node.id) {
        return Err("is excluded".to_string());
    }
    let Some(pool) = best_pool(node, request) else {
        return Err(format!("has no {}", pool_noun(request)));
    };
    let missing: Vec<&str> = context
        .keys
        .iter()
        .copied()
        .filter(|key| !node.labels.contains_key(*key))
        .collect();
    if !missing.is_empty() {
        return Err(format!("has no {} label", join_and(&missing, "or")));
    }
    let values = context
        .keys
        .iter()
        .map(|key| node.labels[*key].as_str())
        .collect();
    Ok(Fit { node, pool, values })
}

/// "pools", "nvme pool", "pool named a or b", "nvme pool named a or b".
fn pool_noun(request: &Request) -> String {
    let names: Vec<&str> = request.pools.iter().map(PoolName::as_str).collect();
    match (request.class, names.is_empty()) {
        (None, true) => "pools".to_string(),
        (Some(class), true) => format!("{class} pool"),
        (None, false) => format!("pool named {}", join_and(&names, "or")),
        (Some(class), false) => format!("{class} pool named {}", join_and(&names, "or")),
    }
}

/// "online nodes with a pool of class nvme and distinct zone labels", or
/// for a single node "online node with a pool of class nvme and a zone label".
fn requirement_text(request: &Request, keys: &[&str], count: usize) -> String {
    let names: Vec<&str> = request.pools.iter().map(PoolName::as_str).collect();
    let pool = match (request.class, names.is_empty()) {
        (None, true) => None,
        (Some(class), true) => Some(format!("a pool of class {class}")),
        (None, false) => Some(format!("a pool named {}", join_and(&names, "or"))),
        (Some(class), false) => Some(format!(
            "a pool of class {class} named {}",
            join_and(&names, "or")
        )),
    };
    let labels = match (keys, count) {
        ([], _) => None,
        ([key], 1) => Some(format!("a {key} label")),
        (keys, 1) => Some(format!("{} labels", join_and(keys, "and"))),
        (keys, _) => Some(format!("distinct {} labels", join_and(keys, "and"))),
    };
    let nodes = if count == 1 {
        "online node"
    } else {
        "online nodes"
    };
    match (pool, labels) {
        (None, None) => nodes.to_string(),
        (Some(pool), None) => format!("{nodes} with {pool}"),
        (None, Some(labels)) => format!("{nodes} with {labels}"),
        (Some(pool), Some(labels)) => format!("{nodes} with {pool} and {labels}"),
    }
}

/// "a", "a or b", "a, b or c".
fn join_and(words: &[&str], conjunction: &str) -> String {
    match words {
        [] => String::new(),
        [only] => (*only).to_string(),
        [init @ .., last] => format!("{} {conjunction} {last}", init.join(", ")),
    }
}

fn place_manually(
    candidates: &[Candidate],
    context: &Context,
    kept: &[&Candidate],
    names: &[NodeName],
) -> Result<Vec<(NodeId, PoolName)>, PlacementError> {
    if names.is_empty() {
        return Err(PlacementError::InvalidRequest {
            reason: "the node list is empty; name at least one node".to_string(),
        });
    }
    let mut seen = BTreeSet::new();
    let mut fits = Vec::with_capacity(names.len());
    for name in names {
        if !seen.insert(name) {
            return Err(PlacementError::DuplicateNode { name: name.clone() });
        }
        let node = candidates
            .iter()
            .find(|c| &c.name == name)
            .ok_or_else(|| PlacementError::UnknownNode { name: name.clone() })?;
        let fit = assess(node, context).map_err(|reason| PlacementError::NodeUnusable {
            name: name.clone(),
            reason,
        })?;
        fits.push(fit);
    }

    // Kept replicas come first so that a conflict names the existing
    // replica before the newly requested one.
    for (index, fit) in fits.iter().enumerate() {
        for other in kept {
            if let Some((key, value)) = shared_label(context.keys, other, fit.node) {
                return Err(label_conflict(other, fit.node, key, value));
            }
        }
        for other in &fits[..index] {
            if let Some((key, value)) = shared_label(context.keys, other.node, fit.node) {
                return Err(label_conflict(other.node, fit.node, key, value));
            }
        }
    }
    Ok(fits
        .iter()
        .map(|fit| (fit.node.id, fit.pool.name.clone()))
        .collect())
}

fn shared_label<'k>(keys: &[&'k str], a: &Candidate, b: &Candidate) -> Option<(&'k str, String)> {
    keys.iter()
        .find_map(|key| match (a.labels.get(*key), b.labels.get(*key)) {
            (Some(x), Some(y)) if x == y => Some((*key, x.clone())),
            _ => None,
        })
}

fn label_conflict(
    first: &Candidate,
    second: &Candidate,
    key: &str,
    value: String,
) -> PlacementError {
    PlacementError::LabelConflict {
        first: first.name.clone(),
        second: second.name.clone(),
        key: key.to_string(),
        value,
    }
}

fn place_automatically(
    candidates: &[Candidate],
    context: &Context,
    kept: &[&Candidate],
) -> Result<Vec<(NodeId, PoolName)>, PlacementError> {
    let request = context.request;
    if request.place_count == 0 {
        return Err(PlacementError::InvalidRequest {
            reason: "place-count is 0; it must be at least 1".to_string(),
        });
    }
    if request.min_place_count == 0 {
        return Err(PlacementError::InvalidRequest {
            reason: "min-place-count is 0; it must be at least 1".to_string(),
        });
    }
    if request.min_place_count > request.place_count {
        return Err(PlacementError::InvalidRequest {
            reason: format!(
                "min-place-count {} is more than place-count {}",
                request.min_place_count, request.place_count
            ),
        });
    }

    let mut fits = Vec::new();
    let mut unfit = Vec::new();
    for node in candidates {
        match assess(node, context) {
            Ok(fit) => fits.push(fit),
            // Kept nodes appear in the refusal's found list instead.
            Err(_) if context.kept_ids.contains(&node.id) => {}
            Err(reason) => unfit.push((node, reason)),
        }
    }
    fits.sort_by(|a, b| preference(a, b, request.seed));

    let kept_values: Vec<BTreeSet<&str>> = context
        .keys
        .iter()
        .map(|key| {
            kept.iter()
                .filter_map(|node| node.labels.get(*key).map(String::as_str))
                .collect()
        })
        .collect();
    let need = request.place_count.saturating_sub(kept.len());
    let chosen = Search::run(&fits, &kept_values, need);

    if kept.len() + chosen.len() >= request.min_place_count {
        return Ok(chosen
            .iter()
            .map(|&index| (fits[index].node.id, fits[index].pool.name.clone()))
            .collect());
    }

    let mut found: Vec<(&NodeName, String)> = kept
        .iter()
        // A kept replica on a node that is down holds no usable copy now:
        // say so, or the count reads as if that node were available.
        .map(|node| {
            let note = match (node.evicted, node.online) {
                (true, _) => "kept, on an evicted node",
                (false, false) => "kept, on an offline node",
                (false, true) => "kept",
            };
            (&node.name, format!("{} ({note})", node.name))
        })
        .chain(chosen.iter().map(|&index| {
            let name = &fits[index].node.name;
            (name, name.to_string())
        }))
        .collect();
    found.sort();
    let mut left_out: Vec<(&NodeName, String)> = unfit
        .into_iter()
        .map(|(node, reason)| (&node.name, format!("node {} {reason}", node.name)))
        .collect();
    for (index, fit) in fits.iter().enumerate() {
        if chosen.contains(&index) {
            continue;
        }
        let placed = kept
            .iter()
            .copied()
            .chain(chosen.iter().map(|&other| fits[other].node));
        let reason = placed
            .filter_map(|other| {
                shared_label(context.keys, fit.node, other).map(|(key, value)| {
                    format!(
                        "node {} shares {key}={value} with {}",
                        fit.node.name, other.name
                    )
                })
            })
            .next()
            // Only reachable when the search ran out of budget.
            .unwrap_or_else(|| format!("node {} was not reached by the search", fit.node.name));
        left_out.push((&fit.node.name, reason));
    }
    left_out.sort();
    let mut left_out: Vec<String> = left_out.into_iter().map(|(_, text)| text).collect();
    if candidates.is_empty() {
        left_out.push("the cluster has no nodes".to_string());
    }

    Err(PlacementError::NotEnoughNodes {
        place_count: request.place_count,
        needed: request.min_place_count,
        requirement: requirement_text(request, context.keys, request.min_place_count),
        found: found.into_iter().map(|(_, text)| text).collect(),
        left_out,
    })
}

/// Weighted rendezvous order: the node with the smallest
/// `-log2(u) / free_bytes` comes first, `u` uniform from a hash of the seed
/// and the node id. The first node is then picked with probability
/// proportional to its free bytes, and the whole order is a weighted sample
/// without replacement.
fn preference(a: &Fit, b: &Fit, seed: u64) -> Ordering {
    let (weight_a, weight_b) = (a.pool.free_bytes, b.pool.free_bytes);
    let (log_a, log_b) = (
        neg_log2_uniform(node_hash(seed, a.node.id, SALT_PREFERENCE)),
        neg_log2_uniform(node_hash(seed, b.node.id, SALT_PREFERENCE)),
    );
    let by_key = match (weight_a, weight_b) {
        // Full pools still qualify (thin volumes) but only after every pool
        // with room, in hash order among themselves.
        (0, 0) => log_a.cmp(&log_b),
        (0, _) => Ordering::Greater,
        (_, 0) => Ordering::Less,
        // log_a / weight_a < log_b / weight_b, without division: the
        // products are below 2^38 * 2^64, well inside u128.
        _ => (u128::from(log_a) * u128::from(weight_b))
            .cmp(&(u128::from(log_b) * u128::from(weight_a))),
    };
    by_key.then_with(|| a.node.id.cmp(&b.node.id))
}

// Separate salts keep the tiebreaker's order independent of the diskful
// order; otherwise the tiebreaker would lean to the runner-up diskful node.
const SALT_PREFERENCE: u64 = 0x5052_4546_4552_454e;
const SALT_TIEBREAKER: u64 = 0x5449_4542_5245_414b;

fn splitmix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

fn node_hash(seed: u64, id: NodeId, salt: u64) -> u64 {
    splitmix64(seed ^ splitmix64(id.0 ^ salt))
}

/// `-log2(u)` in 32.32 fixed point for `u = x / 2^63`, `x` taken from the top
/// 63 bits of `hash` plus one, so `u` is in (0, 1] and the result finite.
fn neg_log2_uniform(hash: u64) -> u64 {
    let x = (hash >> 1) + 1;
    (63u64 << 32) - log2_fixed(x)
}

/// `log2(x)` in 32.32 fixed point, by the bit-by-bit squaring method: exact
/// integer steps, so every platform computes the same bits.
fn log2_fixed(x: u64) -> u64 {
    debug_assert!(x > 0);
    let integer = u64::from(63 - x.leading_zeros());
    // The mantissa as a Q1.63 number in [1, 2).
    let mut mantissa = u128::from(x) << (63 - integer);
    let mut fraction = 0u64;
    for bit in (0..32).rev() {
        mantissa = (mantissa * mantissa) >> 63;
        if mantissa >= 1 << 64 {
            mantissa >>= 1;
            fraction |= 1 << bit;
        }
    }
    (integer << 32) | fraction
}

/// The backtracking search for the largest label-compatible set of nodes.
struct Search<'f, 'c> {
    fits: &'f [Fit<'c>],
    /// `usable[i]`: node i shares no label value with a kept replica.
    usable: Vec<bool>,
    /// `compatible[i][j]`: nodes i and j share no constrained label value.
    compatible: Vec<Vec<bool>>,
    need: usize,
    best: Vec<usize>,
    budget: usize,
}

impl<'f, 'c> Search<'f, 'c> {
    /// Returns indices into `fits` (which must be in preference order) of
    /// the largest compatible set of at most `need` nodes; among sets of that
    /// size, the first in lexicographic preference order.
    fn run(fits: &'f [Fit<'c>], kept_values: &[BTreeSet<&str>], need: usize) -> Vec<usize> {
        let usable = fits
            .iter()
            .map(|fit| {
                fit.values
                    .iter()
                    .zip(kept_values)
                    .all(|(value, taken)| !taken.contains(value))
            })
            .collect();
        let compatible = fits
            .iter()
            .map(|a| {
                fits.iter()
                    .map(|b| a.values.iter().zip(&b.values).all(|(x, y)| x != y))
                    .collect()
            })
            .collect();
        let mut search = Search {
            fits,
            usable,
            compatible,
            need,
            best: Vec::new(),
            budget: SEARCH_BUDGET,
        };
        if need > 0 {
            search.extend(0, &mut Vec::new());
        }
        search.best
    }

    fn done(&self) -> bool {
        self.best.len() >= self.need || self.budget == 0
    }

    fn extend(&mut self, start: usize, chosen: &mut Vec<usize>) {
        if chosen.len() > self.best.len() {
            self.best = chosen.clone();
        }
        if self.done() {
            return;
        }
        self.budget -= 1;
        let open: Vec<usize> = (start..self.fits.len())
            .filter(|&i| self.usable[i] && chosen.iter().all(|&c| self.compatible[c][i]))
            .collect();
        let bounds = self.suffix_bounds(&open);
        for (position, &node) in open.iter().enumerate() {
            // Cut branches that cannot beat the best set already found:
            // this is what keeps a hopeless search (too few zones) short.
            if chosen.len() + bounds[position] <= self.best.len() {
                return;
            }
            chosen.push(node);
            self.extend(node + 1, chosen);
            chosen.pop();
            if self.done() {
                return;
            }
        }
    }

    /// `bounds[p]`: at most this many of `open[p..]` fit together, since no
    /// more can than there are nodes, nor than there are distinct values of
    /// any one key. One pass from the end keeps a step's cost near linear.
    fn suffix_bounds(&self, open: &[usize]) -> Vec<usize> {
        let keys = self.fits.first().map_or(0, |fit| fit.values.len());
        let mut seen: Vec<BTreeSet<&str>> = vec![BTreeSet::new(); keys];
        let mut bounds = vec![0; open.len()];
        for (position, &node) in open.iter().enumerate().rev() {
            for (key, values) in seen.iter_mut().enumerate() {
                values.insert(self.fits[node].values[key]);
            }
            bounds[position] = seen
                .iter()
                .map(BTreeSet::len)
                .fold(open.len() - position, usize::min);
        }
        bounds
    }
}

fn choose_tiebreaker(
    eligible: &[&Candidate],
    diskful: &[&Candidate],
    keys: &[&str],
    seed: u64,
) -> Option<NodeId> {
    let differs_from_all = |node: &Candidate| {
        keys.iter().all(|key| match node.labels.get(*key) {
            // A node without the label may well sit beside a replica.
            None => false,
            Some(value) => diskful
                .iter()
                .all(|replica| replica.labels.get(*key) != Some(value)),
        })
    };
    eligible
        .iter()
        .min_by_key(|node| {
            (
                !differs_from_all(node),
                node_hash(seed, node.id, SALT_TIEBREAKER),
                node.id,
            )
        })
        .map(|node| node.id)
}

/// A stable seed from a volume's name (FNV-1a), so ties in placement spread
/// volumes across nodes the same way on every node.
pub fn name_seed(name: &str) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in name.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(
        id: u64,
        name: &str,
        labels: &[(&str, &str)],
        pools: &[(&str, DeviceClass, u64)],
    ) -> Candidate {
        Candidate {
            id: NodeId(id),
            name: NodeName::new(name).unwrap(),
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            online: true,
            evicted: false,
            pools: pools
                .iter()
                .map(|(pool, class, free)| CandidatePool {
                    name: PoolName::new(*pool).unwrap(),
                    class: *class,
                    capacity_bytes: 1 << 40,
                    free_bytes: *free,
                })
                .collect(),
        }
    }

    fn ssd(id: u64, name: &str, zone: &str) -> Candidate {
        node(
            id,
            name,
            &[("zone", zone)],
            &[("p", DeviceClass::Ssd, 1 << 30)],
        )
    }

    fn request(place_count: usize) -> Request<'static> {
        Request {
            size_bytes: 1 << 30,
            place_count,
            min_place_count: place_count,
            pools: &[],
            class: None,
            replicas_on_different: &[],
            diskless_on_remaining: false,
            manual_nodes: None,
            exclude: &[],
            keep: &[],
            seed: 7,
        }
    }

    fn ids(placement: &Placement) -> BTreeSet<u64> {
        placement.diskful.iter().map(|(id, _)| id.0).collect()
    }

    fn zone_key() -> Vec<String> {
        vec!["zone".to_string()]
    }

    fn names(list: &[&str]) -> Vec<NodeName> {
        list.iter().map(|n| NodeName::new(*n).unwrap()).collect()
    }

    #[test]
    fn log2_is_exact_on_powers_and_close_elsewhere() {
        assert_eq!(log2_fixed(1), 0);
        assert_eq!(log2_fixed(1 << 40), 40 << 32);
        let three = log2_fixed(3) as f64 / (1u64 << 32) as f64;
        assert!((three - 3f64.log2()).abs() < 1e-8, "{three}");
        assert_eq!(neg_log2_uniform(u64::MAX), 0);
        assert_eq!(neg_log2_uniform(0), 63 << 32);
    }

    #[test]
    fn three_zones_give_three_replicas() {
        let nodes = [
            ssd(1, "a", "z1"),
            ssd(2, "b", "z2"),
            ssd(3, "c", "z3"),
            ssd(4, "d", "z1"),
        ];
        let keys = zone_key();
        let req = Request {
            replicas_on_different: &keys,
            ..request(3)
        };
        let placement = place(&nodes, &req).unwrap();
        let placed = ids(&placement);
        assert_eq!(placed.len(), 3);
        assert!(placed.contains(&2) && placed.contains(&3), "{placed:?}");
        assert_eq!(placement.tiebreaker, None);
    }

    #[test]
    fn too_few_zones_are_refused_with_the_zones_found() {
        let nodes = [ssd(1, "a", "z1"), ssd(2, "b", "z2"), ssd(3, "c", "z1")];
        let keys = zone_key();
        let req = Request {
            replicas_on_different: &keys,
            ..request(3)
        };
        let error = place(&nodes, &req).unwrap_err();
        let text = error.to_string();
        assert!(
            text.starts_with(
                "place-count 3 needs 3 online nodes with distinct zone labels; found 2: "
            ),
            "{text}"
        );
        assert!(text.contains("shares zone=z1 with"), "{text}");
        assert!(!text.contains('\n'));
    }

    #[test]
    fn refusal_says_why_nodes_were_left_out() {
        let mut c = node(3, "c", &[], &[("p", DeviceClass::Nvme, 100)]);
        c.online = false;
        let nodes = [
            node(1, "a", &[], &[("p", DeviceClass::Nvme, 100)]),
            c,
            node(4, "d", &[], &[("p", DeviceClass::Ssd, 100)]),
        ];
        let req = Request {
            class: Some(DeviceClass::Nvme),
            ..request(2)
        };
        let text = place(&nodes, &req).unwrap_err().to_string();
        assert_eq!(
            text,
            "place-count 2 needs 2 online nodes with a pool of class nvme; found 1: a (node c is offline, node d has no nvme pool)"
        );
    }

    #[test]
    fn refusal_names_missing_label_keys_and_evicted_and_excluded_nodes() {
        let mut b = ssd(2, "b", "z2");
        b.evicted = true;
        let nodes = [
            ssd(1, "a", "z1"),
            b,
            ssd(3, "c", "z3"),
            node(4, "d", &[], &[("p", DeviceClass::Ssd, 1)]),
        ];
        let keys = zone_key();
        let req = Request {
            replicas_on_different: &keys,
            exclude: &[NodeId(3)],
            ..request(2)
        };
        let text = place(&nodes, &req).unwrap_err().to_string();
        assert_eq!(
            text,
            "place-count 2 needs 2 online nodes with distinct zone labels; found 1: a (node b is evicted, node c is excluded, node d has no zone label)"
        );
    }

    #[test]
    fn min_place_count_accepts_fewer_and_one_node_clusters_work() {
        let nodes = [ssd(1, "a", "z1")];
        let req = Request {
            min_place_count: 1,
            ..request(3)
        };
        let placement = place(&nodes, &req).unwrap();
        assert_eq!(
            placement.diskful,
            vec![(NodeId(1), PoolName::new("p").unwrap())]
        );
        assert_eq!(placement.tiebreaker, None);

        let req = Request {
            min_place_count: 2,
            ..request(3)
        };
        let text = place(&nodes, &req).unwrap_err().to_string();
        assert_eq!(
            text,
            "place-count 3 needs at least 2 online nodes; found 1: a"
        );
    }

    #[test]
    fn an_empty_cluster_is_refused() {
        let text = place(&[], &request(1)).unwrap_err().to_string();
        assert_eq!(
            text,
            "place-count 1 needs 1 online node; found 0 (the cluster has no nodes)"
        );
    }

    #[test]
    fn invalid_counts_are_refused() {
        let nodes = [ssd(1, "a", "z1")];
        let cases = [
            (0, 1, "place-count is 0"),
            (2, 0, "min-place-count is 0"),
            (2, 3, "min-place-count 3 is more than place-count 2"),
        ];
        for (place_count, min_place_count, expected) in cases {
            let req = Request {
                place_count,
                min_place_count,
                ..request(1)
            };
            let error = place(&nodes, &req).unwrap_err();
            assert!(matches!(error, PlacementError::InvalidRequest { .. }));
            assert!(error.to_string().contains(expected), "{error}");
        }
    }

    #[test]
    fn thin_volumes_may_overcommit_and_the_freest_pool_is_used() {
        let nodes = [node(
            1,
            "a",
            &[],
            &[
                ("small", DeviceClass::Hdd, 10),
                ("big", DeviceClass::Hdd, 20),
                ("aaa", DeviceClass::Hdd, 20),
            ],
        )];
        let req = Request {
            size_bytes: 1 << 50,
            ..request(1)
        };
        let placement = place(&nodes, &req).unwrap();
        assert_eq!(
            placement.diskful,
            vec![(NodeId(1), PoolName::new("aaa").unwrap())]
        );

        let filter = [PoolName::new("small").unwrap()];
        let req = Request {
            pools: &filter,
            ..req
        };
        let placement = place(&nodes, &req).unwrap();
        assert_eq!(placement.diskful[0].1.as_str(), "small");
    }

    #[test]
    fn backtracking_finds_the_set_greedy_misses() {
        // x is compatible with neither y nor z, while y and z fit together:
        // taking the freest node first would stop at one replica.
        let nodes = [
            node(
                1,
                "x",
                &[("zone", "z1"), ("rack", "r1")],
                &[("p", DeviceClass::Ssd, u64::MAX)],
            ),
            node(
                2,
                "y",
                &[("zone", "z1"), ("rack", "r2")],
                &[("p", DeviceClass::Ssd, 1)],
            ),
            node(
                3,
                "z",
                &[("zone", "z2"), ("rack", "r1")],
                &[("p", DeviceClass::Ssd, 1)],
            ),
        ];
        let keys = vec!["zone".to_string(), "rack".to_string()];
        for seed in 0..20 {
            let req = Request {
                replicas_on_different: &keys,
                seed,
                ..request(2)
            };
            let placement = place(&nodes, &req).unwrap();
            assert_eq!(ids(&placement), BTreeSet::from([2, 3]));
            assert_eq!(placement.tiebreaker, Some(NodeId(1)));
        }
    }

    #[test]
    fn more_free_space_is_preferred_in_proportion() {
        let nodes = [
            node(1, "a", &[], &[("p", DeviceClass::Ssd, 3 << 30)]),
            node(2, "b", &[], &[("p", DeviceClass::Ssd, 1 << 30)]),
            node(3, "c", &[], &[("p", DeviceClass::Ssd, 0)]),
        ];
        let mut first = [0usize; 4];
        for seed in 0..4000 {
            let req = Request { seed, ..request(1) };
            let placement = place(&nodes, &req).unwrap();
            first[placement.diskful[0].0 .0 as usize] += 1;
        }
        // Expected 3000 : 1000 : 0.
        assert!((2800..=3200).contains(&first[1]), "{first:?}");
        assert_eq!(first[3], 0, "a full pool comes after every pool with room");

        // A full pool is still used when it is needed.
        let placement = place(&nodes, &request(3)).unwrap();
        assert_eq!(ids(&placement), BTreeSet::from([1, 2, 3]));
    }

    #[test]
    fn equal_nodes_share_the_load_across_seeds() {
        let nodes: Vec<Candidate> = (1..=4)
            .map(|id| {
                node(
                    id,
                    &format!("n{id}"),
                    &[],
                    &[("p", DeviceClass::Ssd, 1 << 30)],
                )
            })
            .collect();
        let mut count = [0usize; 5];
        for seed in 0..2000 {
            let placement = place(&nodes, &Request { seed, ..request(2) }).unwrap();
            for (id, _) in &placement.diskful {
                count[id.0 as usize] += 1;
            }
        }
        for id in 1..=4 {
            assert!((850..=1150).contains(&count[id]), "{count:?}");
        }
    }

    #[test]
    fn the_order_of_candidates_does_not_matter() {
        let nodes = [
            ssd(1, "a", "z1"),
            ssd(2, "b", "z2"),
            ssd(3, "c", "z3"),
            ssd(4, "d", "z1"),
            ssd(5, "e", "z2"),
        ];
        let mut reversed = nodes.to_vec();
        reversed.reverse();
        let keys = zone_key();
        for seed in 0..50 {
            let req = Request {
                replicas_on_different: &keys,
                diskless_on_remaining: true,
                seed,
                ..request(2)
            };
            assert_eq!(place(&nodes, &req), place(&reversed, &req));
        }
    }

    #[test]
    fn even_counts_get_a_tiebreaker_from_another_zone() {
        let nodes = [
            ssd(1, "a", "z1"),
            ssd(2, "b", "z2"),
            // Same zone as a replica: only chosen if nothing better exists.
            node(3, "c", &[("zone", "z1")], &[]),
            node(4, "d", &[("zone", "z3")], &[]),
            node(5, "e", &[], &[]),
        ];
        let keys = zone_key();
        for seed in 0..30 {
            let req = Request {
                replicas_on_different: &keys,
                diskless_on_remaining: true,
                seed,
                ..request(2)
            };
            let placement = place(&nodes, &req).unwrap();
            assert_eq!(ids(&placement), BTreeSet::from([1, 2]));
            assert_eq!(placement.tiebreaker, Some(NodeId(4)));
            assert_eq!(placement.diskless, vec![NodeId(3), NodeId(5)]);
        }
    }

    #[test]
    fn no_tiebreaker_without_a_spare_node_or_for_odd_counts() {
        let nodes = [ssd(1, "a", "z1"), ssd(2, "b", "z2")];
        let placement = place(&nodes, &request(2)).unwrap();
        assert_eq!(placement.tiebreaker, None);
        assert!(placement.diskless.is_empty());

        let mut offline = ssd(3, "c", "z3");
        offline.online = false;
        let nodes = [
            ssd(1, "a", "z1"),
            ssd(2, "b", "z2"),
            offline,
            ssd(4, "d", "z4"),
        ];
        let req = Request {
            diskless_on_remaining: true,
            ..request(3)
        };
        let placement = place(&nodes, &req).unwrap();
        assert_eq!(ids(&placement), BTreeSet::from([1, 2, 4]));
        assert_eq!(placement.tiebreaker, None);
        assert!(
            placement.diskless.is_empty(),
            "offline nodes are not members"
        );
    }

    #[test]
    fn replacement_keeps_existing_replicas_and_their_zones() {
        let mut evicted = ssd(2, "b", "z2");
        evicted.evicted = true;
        let nodes = [
            ssd(1, "a", "z1"),
            evicted,
            ssd(3, "c", "z1"),
            ssd(4, "d", "z3"),
            ssd(5, "e", "z2"),
        ];
        let keys = zone_key();
        let keep = [(NodeId(1), PoolName::new("p").unwrap())];
        let req = Request {
            replicas_on_different: &keys,
            keep: &keep,
            exclude: &[NodeId(2)],
            ..request(3)
        };
        let placement = place(&nodes, &req).unwrap();
        assert_eq!(placement.diskful[0], keep[0]);
        assert_eq!(ids(&placement), BTreeSet::from([1, 4, 5]));

        // With the z2 node gone too, only two zones remain.
        let req = Request {
            exclude: &[NodeId(2), NodeId(5)],
            ..req
        };
        let text = place(&nodes, &req).unwrap_err().to_string();
        assert!(text.contains("found 2: a (kept), d"), "{text}");
        assert!(text.contains("node c shares zone=z1 with a"), "{text}");
    }

    #[test]
    fn a_kept_replica_on_a_node_that_is_down_is_not_counted_as_available() {
        let mut evicted = ssd(3, "c", "z3");
        evicted.evicted = true;
        let mut offline = ssd(2, "b", "z2");
        offline.online = false;
        let nodes = [ssd(1, "a", "z1"), offline, evicted];
        let keep = [
            (NodeId(1), PoolName::new("p").unwrap()),
            (NodeId(2), PoolName::new("p").unwrap()),
            (NodeId(3), PoolName::new("p").unwrap()),
        ];
        let req = Request {
            keep: &keep,
            ..request(4)
        };
        let text = place(&nodes, &req).unwrap_err().to_string();
        assert!(
            text.contains("a (kept), b (kept, on an offline node), c (kept, on an evicted node)"),
            "{text}"
        );
    }

    #[test]
    fn keeping_enough_replicas_places_nothing_new() {
        let nodes = [ssd(1, "a", "z1"), ssd(2, "b", "z2"), ssd(3, "c", "z3")];
        let keep = [
            (NodeId(1), PoolName::new("p").unwrap()),
            (NodeId(2), PoolName::new("p").unwrap()),
        ];
        let req = Request {
            keep: &keep,
            ..request(2)
        };
        let placement = place(&nodes, &req).unwrap();
        assert_eq!(placement.diskful, keep.to_vec());
        assert_eq!(placement.tiebreaker, Some(NodeId(3)));
    }

    #[test]
    fn bad_keep_entries_are_refused() {
        let nodes = [ssd(1, "a", "z1")];
        let keep = [(NodeId(9), PoolName::new("p").unwrap())];
        let error = place(
            &nodes,
            &Request {
                keep: &keep,
                ..request(1)
            },
        )
        .unwrap_err();
        assert!(error.to_string().contains("node id 9"), "{error}");
        let keep = [
            (NodeId(1), PoolName::new("p").unwrap()),
            (NodeId(1), PoolName::new("q").unwrap()),
        ];
        let error = place(
            &nodes,
            &Request {
                keep: &keep,
                ..request(2)
            },
        )
        .unwrap_err();
        assert!(
            error.to_string().contains("node a holds two kept replicas"),
            "{error}"
        );
    }

    #[test]
    fn manual_nodes_get_exactly_the_replicas() {
        let nodes = [
            ssd(1, "a", "z1"),
            ssd(2, "b", "z2"),
            ssd(3, "c", "z3"),
            ssd(4, "d", "z1"),
        ];
        let list = names(&["d", "b"]);
        let req = Request {
            manual_nodes: Some(&list),
            diskless_on_remaining: true,
            ..request(3)
        };
        let placement = place(&nodes, &req).unwrap();
        assert_eq!(
            placement
                .diskful
                .iter()
                .map(|(id, _)| id.0)
                .collect::<Vec<_>>(),
            vec![4, 2]
        );
        assert!(placement.tiebreaker.is_some());
        assert_eq!(placement.diskless.len(), 1);
    }

    #[test]
    fn manual_placement_refusals() {
        let mut offline = ssd(3, "c", "z3");
        offline.online = false;
        let mut evicted = ssd(5, "e", "z5");
        evicted.evicted = true;
        let nodes = [
            ssd(1, "a", "z1"),
            ssd(2, "b", "z1"),
            offline,
            node(4, "d", &[("zone", "z4")], &[("p", DeviceClass::Hdd, 1)]),
            evicted,
            node(6, "f", &[], &[("p", DeviceClass::Ssd, 1)]),
        ];
        let keys = zone_key();
        let cases: [(&[&str], &str); 7] = [
            (&["a", "x"], "node x is not a member of the cluster"),
            (&["a", "a"], "node a is listed twice"),
            (&["c"], "node c cannot take a replica: it is offline"),
            (&["e"], "node e cannot take a replica: it is evicted"),
            (&["d"], "node d cannot take a replica: it has no ssd pool"),
            (&["f"], "node f cannot take a replica: it has no zone label"),
            (
                &["a", "b"],
                "nodes a and b share zone=z1; replicas must be on different zone values",
            ),
        ];
        for (list, expected) in cases {
            let list = names(list);
            let req = Request {
                manual_nodes: Some(&list),
                class: Some(DeviceClass::Ssd),
                replicas_on_different: &keys,
                ..request(2)
            };
            let error = place(&nodes, &req).unwrap_err();
            assert_eq!(error.to_string(), expected);
        }

        let list = names(&["a"]);
        let req = Request {
            manual_nodes: Some(&list),
            exclude: &[NodeId(1)],
            ..request(1)
        };
        assert_eq!(
            place(&nodes, &req).unwrap_err().to_string(),
            "node a cannot take a replica: it is excluded"
        );
        let req = Request {
            manual_nodes: Some(&[]),
            ..request(1)
        };
        assert!(matches!(
            place(&nodes, &req),
            Err(PlacementError::InvalidRequest { .. })
        ));
    }

    #[test]
    fn manual_nodes_must_differ_from_kept_ones() {
        let nodes = [ssd(1, "a", "z1"), ssd(2, "b", "z1"), ssd(3, "c", "z2")];
        let keys = zone_key();
        let keep = [(NodeId(1), PoolName::new("p").unwrap())];
        let list = names(&["b"]);
        let req = Request {
            manual_nodes: Some(&list),
            replicas_on_different: &keys,
            keep: &keep,
            ..request(2)
        };
        assert_eq!(
            place(&nodes, &req).unwrap_err().to_string(),
            "nodes a and b share zone=z1; replicas must be on different zone values"
        );
        let list = names(&["a"]);
        let req = Request {
            manual_nodes: Some(&list),
            ..req
        };
        assert_eq!(
            place(&nodes, &req).unwrap_err().to_string(),
            "node a cannot take a replica: it already holds a replica of this volume"
        );
    }

    #[test]
    fn placement_round_trips_through_json() {
        let nodes = [ssd(1, "a", "z1"), ssd(2, "b", "z2"), ssd(3, "c", "z3")];
        let placement = place(&nodes, &request(2)).unwrap();
        let text = serde_json::to_string(&placement).unwrap();
        assert_eq!(serde_json::from_str::<Placement>(&text).unwrap(), placement);
    }
}
