//! How many nodes must acknowledge a permit so that the holders of a key never number
//! more than its limit across the cluster.
//!
//! A majority is not enough once the limit `N` is above 1: each node admits up to `N`
//! holders, and with five nodes and `N = 2`, holders A, B, C acknowledged by nodes
//! {1,2,3}, {3,4,5} and {1,2,4,5} would each have a majority while every node holds at
//! most two of them (nodes 1 and 2 hold A and C, node 3 A and B, nodes 4 and 5 B and C):
//! three holders of two permits.
//!
//! **The count that caps it.** `M` nodes; every holder is acknowledged by at least `q` of
//! them, and every node holds at most `N` permits (its script admits a permit only while
//! fewer than `N` live entries hold the key, and [`claim`] gives one back only where one
//! is free). Counting acknowledgements two ways, `H` holders need `H * q` of them and the
//! nodes have at most `M * N`, so `H * q <= M * N`. For `H = N + 1` to be impossible we
//! need `(N + 1) * q > M * N`, that is `q = floor(M * N / (N + 1)) + 1` (capped at `M`).
//! With `N = 1` this is the majority, `floor(M / 2) + 1`, as for the mutex.
//!
//! **It is tight.** With `q' = q - 1`, `(N + 1) * q' <= M * N`: place the `N + 1` holders'
//! acknowledgements round-robin over the nodes (holder `h` on nodes `h * q'`, …,
//! `h * q' + q' - 1`, modulo `M`); each node is then used at most
//! `ceil((N + 1) * q' / M) <= N` times, so every node admits all of its holders. A smaller
//! count cannot cap the total; [`round_robin_fits`] checks this for small clusters.
//!
//! **What it costs.** The lease survives only while `q` nodes can be reached (an acquire
//! needs `q` grants, an extension `q` extended nodes): with `M = 5`, `N = 1` tolerates 2
//! nodes down, `N = 2` or `3` (q = 4) one, and `N >= 4` (q = 5) none. As for the mutex,
//! the cap rests on Redlock's timing assumptions (node clocks that do not jump, holders
//! that stop within their validity).
//!
//! [`claim`]: dlock_redis::server::Node::claim

/// The acknowledgements a permit of a `limit`-permit key needs on `nodes` nodes:
/// `floor(nodes * limit / (limit + 1)) + 1`, at most `nodes` (see the module docs).
pub(crate) fn permit_quorum(nodes: usize, limit: u32) -> usize {
    let (m, n) = (nodes as u64, u64::from(limit.max(1)));
    let q = m * n / (n + 1) + 1;
    usize::try_from(q.min(m)).unwrap_or(nodes)
}

/// Whether `limit + 1` holders, each acknowledged by `acks` nodes, can be placed on
/// `nodes` nodes with no node holding more than `limit` of them (round-robin placement).
#[cfg(test)]
fn round_robin_fits(nodes: usize, limit: usize, acks: usize) -> bool {
    let mut load = vec![0; nodes];
    for slot in 0..(limit + 1) * acks {
        load[slot % nodes] += 1;
    }
    // Round-robin never puts one holder twice on a node while acks <= nodes.
    acks <= nodes && load.iter().all(|l| *l <= limit)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn five_nodes_need_a_majority_for_one_permit_and_every_node_from_four() {
        let q: Vec<usize> = (1..=6).map(|n| permit_quorum(5, n)).collect();
        assert_eq!(q, [3, 4, 4, 5, 5, 5]);
        assert_eq!(permit_quorum(3, 1), 2);
        assert_eq!(permit_quorum(3, 2), 3);
        assert_eq!(permit_quorum(7, 10_000), 7);
    }

    #[test]
    fn the_count_caps_the_holders_and_one_less_does_not() {
        for nodes in [3, 5, 7, 9] {
            for limit in 1..=12 {
                let q = permit_quorum(nodes, limit as u32);
                assert!(q > nodes / 2, "a permit quorum is at least a majority");
                // N + 1 holders need more acknowledgements than the nodes can give.
                assert!((limit + 1) * q > nodes * limit, "{nodes} nodes, {limit}");
                assert!(!round_robin_fits(nodes, limit, q), "{nodes} nodes, {limit}");
                // One acknowledgement fewer lets N + 1 holders in.
                assert!(
                    round_robin_fits(nodes, limit, q - 1),
                    "{nodes} nodes, {limit}"
                );
            }
        }
    }
}
