//! Property tests for the autoplacer: on random clusters its answers are
//! checked against a brute-force search over every subset of nodes.

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;
use trireme_control::placer::{
    place, Candidate, CandidatePool, Placement, PlacementError, Request,
};
use trireme_types::{DeviceClass, NodeId, NodeName, PoolName};

const POOL_NAMES: [&str; 3] = ["p1", "p2", "fast"];
const ZONES: [&str; 3] = ["za", "zb", "zc"];
const RACKS: [&str; 4] = ["r1", "r2", "r3", "r4"];
const CLASSES: [DeviceClass; 3] = [DeviceClass::Nvme, DeviceClass::Ssd, DeviceClass::Hdd];

/// A generated node before it gets its index-derived name and id.
#[derive(Debug, Clone)]
struct NodeSpec {
    zone: Option<usize>,
    rack: Option<usize>,
    online: bool,
    evicted: bool,
    id_high: u64,
    pools: Vec<(usize, usize, u64, u64)>,
}

fn free_bytes() -> impl Strategy<Value = u64> {
    // Repeated values exercise the tie-breaking; zero the "full pool" case.
    prop_oneof![Just(0u64), Just(1u64 << 30), 0u64..(1u64 << 40)]
}

fn node_spec() -> impl Strategy<Value = NodeSpec> {
    (
        prop::option::weighted(0.8, 0..ZONES.len()),
        prop::option::weighted(0.8, 0..RACKS.len()),
        prop::bool::weighted(0.85),
        prop::bool::weighted(0.1),
        0u64..(1 << 40),
        prop::collection::vec(
            (
                0..POOL_NAMES.len(),
                0..CLASSES.len(),
                free_bytes(),
                free_bytes(),
            ),
            0..3,
        ),
    )
        .prop_map(|(zone, rack, online, evicted, id_high, pools)| NodeSpec {
            zone,
            rack,
            online,
            evicted,
            id_high,
            pools,
        })
}

fn build(specs: &[NodeSpec]) -> Vec<Candidate> {
    specs
        .iter()
        .enumerate()
        .map(|(index, spec)| {
            let mut labels = BTreeMap::new();
            if let Some(zone) = spec.zone {
                labels.insert("zone".to_string(), ZONES[zone].to_string());
            }
            if let Some(rack) = spec.rack {
                labels.insert("rack".to_string(), RACKS[rack].to_string());
            }
            let mut seen = BTreeSet::new();
            let pools = spec
                .pools
                .iter()
                .filter(|(name, ..)| seen.insert(*name))
                .map(|&(name, class, a, b)| CandidatePool {
                    name: PoolName::new(POOL_NAMES[name]).unwrap(),
                    class: CLASSES[class],
                    capacity_bytes: a.max(b),
                    free_bytes: a.min(b),
                })
                .collect();
            Candidate {
                // Random high bits keep the id order unrelated to the index.
                id: NodeId((spec.id_high << 8) | index as u64),
                name: NodeName::new(format!("n{index}")).unwrap(),
                labels,
                online: spec.online,
                evicted: spec.evicted,
                pools,
            }
        })
        .collect()
}

/// The request's owned parts; [`Params::request`] borrows them.
#[derive(Debug, Clone)]
struct Params {
    place_count: usize,
    min_place_count: usize,
    keys: Vec<String>,
    class: Option<DeviceClass>,
    pools: Vec<PoolName>,
    exclude_mask: u16,
    diskless_on_remaining: bool,
    seed: u64,
}

fn params() -> impl Strategy<Value = Params> {
    (
        (1usize..=5).prop_flat_map(|place_count| (Just(place_count), 1..=place_count)),
        0u8..4,
        prop::option::weighted(0.4, 0..CLASSES.len()),
        prop::bool::weighted(0.3),
        0u8..8,
        prop::bool::weighted(0.3),
        any::<u16>(),
        any::<bool>(),
        any::<u64>(),
    )
        .prop_map(
            |(
                (place_count, min_place_count),
                key_mask,
                class,
                filter_pools,
                pool_mask,
                use_exclude,
                exclude_mask,
                diskless_on_remaining,
                seed,
            )| Params {
                place_count,
                min_place_count,
                keys: ["zone", "rack"]
                    .iter()
                    .enumerate()
                    .filter(|(bit, _)| key_mask & (1 << bit) != 0)
                    .map(|(_, key)| key.to_string())
                    .collect(),
                class: class.map(|index| CLASSES[index]),
                pools: POOL_NAMES
                    .iter()
                    .enumerate()
                    .filter(|(bit, _)| filter_pools && pool_mask & (1 << bit) != 0)
                    .map(|(_, name)| PoolName::new(*name).unwrap())
                    .collect(),
                exclude_mask: if use_exclude { exclude_mask } else { 0 },
                diskless_on_remaining,
                seed,
            },
        )
}

impl Params {
    fn excluded(&self, nodes: &[Candidate]) -> Vec<NodeId> {
        nodes
            .iter()
            .enumerate()
            .filter(|(index, _)| self.exclude_mask & (1 << index) != 0)
            .map(|(_, node)| node.id)
            .collect()
    }

    fn request<'a>(
        &'a self,
        exclude: &'a [NodeId],
        keep: &'a [(NodeId, PoolName)],
        manual: Option<&'a [NodeName]>,
    ) -> Request<'a> {
        Request {
            size_bytes: 1 << 30,
            place_count: self.place_count,
            min_place_count: self.min_place_count,
            pools: &self.pools,
            class: self.class,
            replicas_on_different: &self.keys,
            diskless_on_remaining: self.diskless_on_remaining,
            manual_nodes: manual,
            exclude,
            keep,
            seed: self.seed,
        }
    }
}

fn pool_matches(pool: &CandidatePool, request: &Request) -> bool {
    (request.pools.is_empty() || request.pools.contains(&pool.name))
        && request.class.is_none_or(|class| class == pool.class)
}

/// The pool the placer must use on `node`: most free bytes, then lowest name.
fn expected_pool<'c>(node: &'c Candidate, request: &Request) -> Option<&'c PoolName> {
    node.pools
        .iter()
        .filter(|pool| pool_matches(pool, request))
        .max_by(|a, b| {
            a.free_bytes
                .cmp(&b.free_bytes)
                .then_with(|| b.name.cmp(&a.name))
        })
        .map(|pool| &pool.name)
}

/// May this node get a new diskful replica? Written independently of the
/// placer, from the rules.
fn qualifies(node: &Candidate, request: &Request) -> bool {
    node.online
        && !node.evicted
        && !request.exclude.contains(&node.id)
        && !request.keep.iter().any(|(id, _)| *id == node.id)
        && expected_pool(node, request).is_some()
        && request
            .replicas_on_different
            .iter()
            .all(|key| node.labels.contains_key(key))
}

fn share_a_value(a: &Candidate, b: &Candidate, keys: &[String]) -> bool {
    keys.iter()
        .any(|key| matches!((a.labels.get(key), b.labels.get(key)), (Some(x), Some(y)) if x == y))
}

fn kept_nodes<'c>(nodes: &'c [Candidate], request: &Request) -> Vec<&'c Candidate> {
    request
        .keep
        .iter()
        .map(|(id, _)| nodes.iter().find(|node| node.id == *id).unwrap())
        .collect()
}

/// The most new replicas any valid placement has, capped at what is still
/// wanted after the kept ones: every subset of qualifying nodes is tried.
fn brute_force_new(nodes: &[Candidate], request: &Request) -> usize {
    let kept = kept_nodes(nodes, request);
    let keys = request.replicas_on_different;
    let open: Vec<&Candidate> = nodes
        .iter()
        .filter(|node| qualifies(node, request))
        .filter(|node| kept.iter().all(|k| !share_a_value(node, k, keys)))
        .collect();
    let want = request.place_count.saturating_sub(kept.len());
    let mut best = 0;
    for mask in 0u32..(1 << open.len()) {
        let size = mask.count_ones() as usize;
        if size <= best || size > want {
            continue;
        }
        let members: Vec<&Candidate> = (0..open.len())
            .filter(|bit| mask & (1 << bit) != 0)
            .map(|bit| open[bit])
            .collect();
        let valid = members
            .iter()
            .enumerate()
            .all(|(i, a)| members[i + 1..].iter().all(|b| !share_a_value(a, b, keys)));
        if valid {
            best = size;
        }
    }
    best
}

fn by_id(nodes: &[Candidate], id: NodeId) -> &Candidate {
    nodes
        .iter()
        .find(|node| node.id == id)
        .unwrap_or_else(|| panic!("placement names unknown node {id}"))
}

/// Everything an accepted placement must satisfy, whoever chose the nodes.
fn check_valid(nodes: &[Candidate], request: &Request, placement: &Placement) {
    let keys = request.replicas_on_different;
    assert!(
        placement.diskful.starts_with(request.keep),
        "kept replicas come first"
    );
    let new = &placement.diskful[request.keep.len()..];
    let ids: BTreeSet<NodeId> = placement.diskful.iter().map(|(id, _)| *id).collect();
    assert_eq!(ids.len(), placement.diskful.len(), "distinct nodes");
    for (id, pool) in new {
        let node = by_id(nodes, *id);
        assert!(qualifies(node, request), "{} does not qualify", node.name);
        assert_eq!(
            Some(pool),
            expected_pool(node, request),
            "pool on {}",
            node.name
        );
    }
    let kept = kept_nodes(nodes, request);
    for (index, (a, _)) in new.iter().enumerate() {
        let a = by_id(nodes, *a);
        for b in kept
            .iter()
            .copied()
            .chain(new[index + 1..].iter().map(|(id, _)| by_id(nodes, *id)))
        {
            assert!(
                !share_a_value(a, b, keys),
                "{} and {} share a label value",
                a.name,
                b.name
            );
        }
    }
    check_members(nodes, request, placement, &ids);
}

fn check_members(
    nodes: &[Candidate],
    request: &Request,
    placement: &Placement,
    diskful: &BTreeSet<NodeId>,
) {
    let keys = request.replicas_on_different;
    let spare: Vec<&Candidate> = nodes
        .iter()
        .filter(|node| node.online && !node.evicted && !diskful.contains(&node.id))
        .collect();
    let diverse = |node: &Candidate| {
        keys.iter().all(|key| {
            node.labels.get(key).is_some_and(|value| {
                diskful
                    .iter()
                    .all(|id| by_id(nodes, *id).labels.get(key) != Some(value))
            })
        })
    };
    match placement.tiebreaker {
        None => assert!(
            placement.diskful.len() % 2 == 1 || spare.is_empty(),
            "an even count with a spare node needs a tiebreaker"
        ),
        Some(id) => {
            assert!(
                placement.diskful.len().is_multiple_of(2),
                "tiebreaker for an odd count"
            );
            let node = by_id(nodes, id);
            assert!(
                spare.iter().any(|s| s.id == id),
                "tiebreaker {} is not a spare",
                node.name
            );
            if spare.iter().any(|s| diverse(s)) {
                assert!(
                    diverse(node),
                    "tiebreaker {} shares a label value",
                    node.name
                );
            }
        }
    }
    let expected: Vec<NodeId> = if request.diskless_on_remaining {
        let mut ids: Vec<NodeId> = spare
            .iter()
            .map(|node| node.id)
            .filter(|id| Some(*id) != placement.tiebreaker)
            .collect();
        ids.sort();
        ids
    } else {
        Vec::new()
    };
    assert_eq!(placement.diskless, expected);
}

/// The automatic placer's answer must be valid, as large as possible and
/// refused exactly when the brute force finds too few nodes.
fn check_automatic(nodes: &[Candidate], request: &Request) -> Result<(), TestCaseError> {
    let best = request.keep.len() + brute_force_new(nodes, request);
    match place(nodes, request) {
        Ok(placement) => {
            check_valid(nodes, request, &placement);
            prop_assert!(placement.diskful.len() >= request.min_place_count);
            prop_assert_eq!(placement.diskful.len(), best, "not maximal");
        }
        Err(error) => {
            prop_assert!(
                best < request.min_place_count,
                "refused, but {} nodes fit: {}",
                best,
                error
            );
            let text = error.to_string();
            prop_assert!(!text.contains('\n'));
            prop_assert!(text.contains(&format!("found {best}")), "{}", text);
            prop_assert!(
                text.starts_with(&format!("place-count {} needs ", request.place_count)),
                "{}",
                text
            );
            let PlacementError::NotEnoughNodes {
                found, left_out, ..
            } = &error
            else {
                return Err(TestCaseError::fail(format!(
                    "unexpected refusal: {error:?}"
                )));
            };
            prop_assert_eq!(found.len(), best);
            // Each node is either in the found list or explained.
            let explained = if nodes.is_empty() { 1 } else { 0 };
            prop_assert_eq!(found.len() + left_out.len(), nodes.len() + explained);
        }
    }
    Ok(())
}

fn cluster() -> impl Strategy<Value = Vec<NodeSpec>> {
    prop::collection::vec(node_spec(), 1..=12)
}

/// Nodes that all qualify and all carry both labels, from small alphabets:
/// the layouts where taking the freest compatible node first falls short
/// and only the backtracking search finds the largest set.
fn dense_cluster() -> impl Strategy<Value = Vec<NodeSpec>> {
    let node = (0..3usize, 0..3usize, 0u64..(1 << 40), free_bytes()).prop_map(
        |(zone, rack, id_high, free)| NodeSpec {
            zone: Some(zone),
            rack: Some(rack),
            online: true,
            evicted: false,
            id_high,
            pools: vec![(0, 0, 1 << 40, free)],
        },
    );
    prop::collection::vec(node, 2..=12)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn the_largest_set_is_found_under_two_label_keys(
        specs in dense_cluster(),
        place_count in 2usize..=4,
        seed in any::<u64>(),
    ) {
        let nodes = build(&specs);
        let keys = vec!["zone".to_string(), "rack".to_string()];
        let request = Request {
            size_bytes: 1 << 30,
            place_count,
            min_place_count: 1,
            pools: &[],
            class: None,
            replicas_on_different: &keys,
            diskless_on_remaining: false,
            manual_nodes: None,
            exclude: &[],
            keep: &[],
            seed,
        };
        check_automatic(&nodes, &request)?;
    }

    #[test]
    fn accepted_placements_are_valid_and_maximal(specs in cluster(), params in params()) {
        let nodes = build(&specs);
        let exclude = params.excluded(&nodes);
        let request = params.request(&exclude, &[], None);
        let best = brute_force_new(&nodes, &request);
        if let Ok(placement) = place(&nodes, &request) {
            check_valid(&nodes, &request, &placement);
            prop_assert!(placement.diskful.len() >= params.min_place_count);
            prop_assert!(placement.diskful.len() <= params.place_count);
            prop_assert_eq!(placement.diskful.len(), best);
        } else {
            prop_assert!(best < params.min_place_count, "refused, but {} nodes fit", best);
        }
    }

    #[test]
    fn refusals_are_justified_and_explained(specs in cluster(), params in params()) {
        let nodes = build(&specs);
        let exclude = params.excluded(&nodes);
        let request = params.request(&exclude, &[], None);
        check_automatic(&nodes, &request)?;
    }

    #[test]
    fn placement_is_deterministic_and_ignores_candidate_order(
        (specs, order) in cluster().prop_flat_map(|specs| {
            let order = Just((0..specs.len()).collect::<Vec<_>>()).prop_shuffle();
            (Just(specs), order)
        }),
        params in params(),
    ) {
        let nodes = build(&specs);
        let shuffled: Vec<Candidate> = order.iter().map(|&i| nodes[i].clone()).collect();
        let exclude = params.excluded(&nodes);
        let request = params.request(&exclude, &[], None);
        let first = place(&nodes, &request);
        prop_assert_eq!(&first, &place(&nodes, &request));
        prop_assert_eq!(&first, &place(&shuffled, &request));
    }

    #[test]
    fn replacement_keeps_replicas_and_fills_the_rest(
        specs in cluster(),
        params in params(),
        keep_mask in any::<u16>(),
    ) {
        let nodes = build(&specs);
        let exclude = params.excluded(&nodes);
        // Kept replicas may sit on any node, even an offline one: they
        // already exist.
        let keep: Vec<(NodeId, PoolName)> = nodes
            .iter()
            .enumerate()
            .filter(|(index, _)| keep_mask & (1 << index) != 0)
            .take(3)
            .map(|(_, node)| (node.id, PoolName::new("p1").unwrap()))
            .collect();
        let request = params.request(&exclude, &keep, None);
        check_automatic(&nodes, &request)?;
    }

    #[test]
    fn manual_placement_accepts_exactly_the_valid_lists(
        specs in cluster(),
        params in params(),
        picks in prop::collection::vec(0usize..14, 1..5),
    ) {
        let nodes = build(&specs);
        let exclude = params.excluded(&nodes);
        // Indices past the cluster's end name nodes that do not exist.
        let list: Vec<NodeName> = picks
            .iter()
            .map(|&i| NodeName::new(format!("n{i}")).unwrap())
            .collect();
        let request = params.request(&exclude, &[], Some(&list));
        let chosen: Vec<Option<&Candidate>> = list
            .iter()
            .map(|name| nodes.iter().find(|node| &node.name == name))
            .collect();
        let distinct = list.iter().collect::<BTreeSet<_>>().len() == list.len();
        let all_qualify = chosen
            .iter()
            .all(|node| node.is_some_and(|node| qualifies(node, &request)));
        let compatible = chosen.iter().flatten().enumerate().all(|(i, a)| {
            chosen.iter().flatten().skip(i + 1).all(|b| !share_a_value(a, b, &params.keys))
        });
        let valid = distinct && all_qualify && compatible;
        match place(&nodes, &request) {
            Ok(placement) => {
                prop_assert!(valid, "accepted an invalid list {:?}", list);
                check_valid(&nodes, &request, &placement);
                let placed: Vec<NodeId> = placement.diskful.iter().map(|(id, _)| *id).collect();
                let wanted: Vec<NodeId> = chosen.iter().flatten().map(|node| node.id).collect();
                prop_assert_eq!(placed, wanted);
            }
            Err(error) => {
                prop_assert!(!valid, "refused a valid list {:?}: {}", list, error);
                prop_assert!(!error.to_string().contains('\n'));
            }
        }
    }
}
