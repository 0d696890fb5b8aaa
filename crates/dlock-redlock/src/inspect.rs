//! Inspecting over the nodes: each node's snapshot of a key, and what a quorum of them
//! agrees on (a holder is one that a quorum of nodes shows, as for a grant).

use std::collections::BTreeMap;
use std::time::Duration;

use dlock_core::{KeyStatus, Mode};
use dlock_redis::server::{NodeHolder, NodeStatus, NodeWaiter, token_mode};

use crate::election::owner;
use crate::permits::permit_quorum;

/// The status of `key` that a quorum of the `nodes` nodes agrees on, from the snapshots
/// of the nodes that answered (`views`):
///
/// - a holder is a token held on as many nodes as its grant needs (`quorum`, or a
///   permit's [`permit_quorum`]); its `ttl_left` is how long that many nodes still keep
///   it (the needed-th longest of its ttls), its fencing token (a writer's) the fence
///   counter that `quorum` of its nodes show (the token is written back to a majority).
///   Tokens are counted by their [`owner`] part, as the nodes' owner checks see them: a
///   leader whose proclaim reached only some nodes (an answer lost, a future dropped)
///   holds the key on all of them, and shows the value most of its nodes carry;
/// - a waiter is a token queued on `quorum` nodes, and the waiters are in ticket order,
///   which is every node's order (the waiter proposed one ticket to all of them).
pub(crate) fn agreed_status(
    key: &str,
    nodes: usize,
    quorum: usize,
    views: &[NodeStatus],
) -> KeyStatus {
    let mut holds: BTreeMap<&str, Vec<&NodeHolder>> = BTreeMap::new();
    let mut queued: BTreeMap<&str, Vec<&NodeWaiter>> = BTreeMap::new();
    for view in views {
        for holder in &view.holders {
            holds.entry(owner(&holder.token)).or_default().push(holder);
        }
        for waiter in &view.waiters {
            queued.entry(&waiter.token).or_default().push(waiter);
        }
    }
    let mut status = KeyStatus::new(key, true);
    for on in holds.into_values() {
        let needed = match token_mode(&on[0].token) {
            Some(Mode::Permits(limit)) => permit_quorum(nodes, limit),
            _ => quorum,
        };
        if on.len() < needed {
            continue;
        }
        let mut holder = most_shown(&on).status();
        // No expiry (`None`) outlasts every ttl.
        let mut ttls: Vec<Option<Duration>> = on.iter().map(|h| h.ttl_left).collect();
        ttls.sort_unstable_by(|a, b| match (a, b) {
            (None, None) => std::cmp::Ordering::Equal,
            (None, Some(_)) => std::cmp::Ordering::Less,
            (Some(_), None) => std::cmp::Ordering::Greater,
            (Some(a), Some(b)) => b.cmp(a),
        });
        holder.ttl_left = ttls[needed - 1];
        holder.fencing_token = agreed_fence(&on, quorum);
        status.holders.push(holder);
    }
    let mut waiters: Vec<(u64, &str, &NodeWaiter)> = queued
        .into_iter()
        .filter(|(_, on)| on.len() >= quorum)
        .map(|(token, on)| {
            let first = on
                .iter()
                .min_by_key(|w| w.ticket)
                .expect("queued somewhere");
            (first.ticket, token, *first)
        })
        .collect();
    waiters.sort_unstable_by_key(|(ticket, token, _)| (*ticket, *token));
    status.waiters = Some(waiters.iter().map(|(_, _, w)| w.status()).collect());
    status
}

/// Of one owner's tokens on its nodes, the one most of them hold (the first node's among
/// equals, nodes in order).
fn most_shown<'a>(on: &[&'a NodeHolder]) -> &'a NodeHolder {
    let count = |token: &str| on.iter().filter(|h| h.token == token).count();
    let mut best = on[0];
    for h in on {
        if count(&h.token) > count(&best.token) {
            best = h;
        }
    }
    best
}

/// The term of the exclusive holder on a quorum of the nodes when no fence counter is
/// agreed on by `quorum` of its nodes (right after its grant, before the fence write-back
/// reached them all): the highest fence that `quorum` of its nodes reached (or, with
/// fewer counters shown, the lowest of those shown). The write-back raises the counters
/// of a majority to the grant's token and no grant moves a held key's counter, so this is
/// the token once the write-back is complete, and never above it. `None`: no such holder,
/// or none of its nodes shows a counter.
pub(crate) fn unsettled_term(quorum: usize, views: &[NodeStatus]) -> Option<u64> {
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for holder in views.iter().flat_map(|v| &v.holders) {
        if holder.mode == Mode::Exclusive {
            *counts.entry(owner(&holder.token)).or_default() += 1;
        }
    }
    let (leader, _) = counts.into_iter().find(|(_, n)| *n >= quorum)?;
    let mut fences: Vec<u64> = views
        .iter()
        .flat_map(|v| &v.holders)
        .filter(|h| owner(&h.token) == leader)
        .filter_map(|h| h.fence)
        .collect();
    fences.sort_unstable_by(|a, b| b.cmp(a));
    let at = quorum.min(fences.len()).checked_sub(1)?;
    Some(fences[at])
}

/// The fence counter that `quorum` of a holder's nodes show, if any.
fn agreed_fence(on: &[&NodeHolder], quorum: usize) -> Option<u64> {
    let mut counts: BTreeMap<u64, usize> = BTreeMap::new();
    for fence in on.iter().filter_map(|h| h.fence) {
        *counts.entry(fence).or_default() += 1;
    }
    counts
        .into_iter()
        .find(|(_, count)| *count >= quorum)
        .map(|(fence, _)| fence)
}

/// The keys that `quorum` of the nodes list, sorted, from the lists of the nodes that
/// answered.
pub(crate) fn agreed_keys(quorum: usize, lists: Vec<Vec<String>>) -> Vec<String> {
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for list in lists {
        for key in list {
            *counts.entry(key).or_default() += 1;
        }
    }
    counts
        .into_iter()
        .filter(|(_, count)| *count >= quorum)
        .map(|(key, _)| key)
        .collect()
}

#[cfg(test)]
mod tests {
    use dlock_redis::server::{new_permit_token, new_reader_token, new_token};

    use super::*;

    fn holder(token: &str, ttl_ms: u64, fence: Option<u64>) -> NodeHolder {
        NodeHolder {
            token: token.into(),
            mode: token_mode(token).unwrap_or(Mode::Exclusive),
            ttl_left: Some(Duration::from_millis(ttl_ms)),
            fence,
        }
    }

    fn node(holders: Vec<NodeHolder>, waiters: &[(&str, u64)]) -> NodeStatus {
        NodeStatus {
            holders,
            waiters: waiters
                .iter()
                .map(|(token, ticket)| NodeWaiter {
                    token: (*token).into(),
                    ticket: *ticket,
                })
                .collect(),
        }
    }

    #[test]
    fn a_writer_on_a_quorum_holds_and_a_minority_does_not() {
        let (w, other) = (new_token(), new_token());
        let views = [
            node(vec![holder(&w, 900, Some(7))], &[]),
            node(vec![holder(&w, 800, Some(7))], &[]),
            node(vec![holder(&w, 1000, Some(5))], &[]),
            node(vec![holder(&other, 500, Some(9))], &[]),
        ];
        let status = agreed_status("k", 5, 3, &views);
        assert_eq!(status.holders.len(), 1, "{status:?}");
        let h = &status.holders[0];
        assert_eq!(h.mode, Mode::Exclusive);
        assert_eq!(
            h.ttl_left,
            Some(Duration::from_millis(800)),
            "3 nodes keep it"
        );
        assert_eq!(h.fencing_token, None, "only 2 nodes show 7");
        assert_eq!(h.who.as_deref(), Some(dlock_core::holder_description()));
        let status = agreed_status("k", 5, 2, &views);
        assert_eq!(status.holders[0].fencing_token, Some(7));
        assert_eq!(status.holders[0].ttl_left, Some(Duration::from_millis(900)));
    }

    #[test]
    fn readers_need_the_majority_and_permits_their_own_quorum() {
        let (r, p) = (new_reader_token(), new_permit_token(3));
        let both = || vec![holder(&r, 100, None), holder(&p, 100, None)];
        let four = [
            node(both(), &[]),
            node(both(), &[]),
            node(both(), &[]),
            node(both(), &[]),
        ];
        let modes: Vec<_> = agreed_status("k", 5, 3, &four)
            .holders
            .iter()
            .map(|h| h.mode)
            .collect();
        assert!(modes.contains(&Mode::Shared) && modes.contains(&Mode::Permits(3)));
        // Permits(3) on 5 nodes needs 4: three nodes show the reader only.
        let three = &four[..3];
        let modes: Vec<_> = agreed_status("k", 5, 3, three)
            .holders
            .iter()
            .map(|h| h.mode)
            .collect();
        assert_eq!(modes, [Mode::Shared]);
    }

    #[test]
    fn waiters_on_a_quorum_show_in_ticket_order() {
        let (a, b, c) = (new_token(), new_reader_token(), new_token());
        let q = [(b.as_str(), 20), (a.as_str(), 10), (c.as_str(), 5)];
        let views = [
            node(Vec::new(), &q),
            node(Vec::new(), &q[..2]),
            node(Vec::new(), &q[..2]),
        ];
        let waiters = agreed_status("k", 3, 2, &views).waiters.unwrap();
        let modes: Vec<_> = waiters.iter().map(|w| w.mode).collect();
        assert_eq!(modes, [Some(Mode::Exclusive), Some(Mode::Shared)]);
    }

    #[test]
    fn a_leader_with_values_differing_by_node_is_one_holder() {
        let old = crate::election::candidate_token("old");
        let new = crate::election::proclaimed_token(&old, "new");
        let views = [
            node(vec![holder(&new, 900, Some(7))], &[]),
            node(vec![holder(&old, 900, Some(7))], &[]),
            node(vec![holder(&new, 900, Some(7))], &[]),
            node(Vec::new(), &[]),
        ];
        let status = agreed_status("k", 5, 3, &views);
        assert_eq!(status.holders.len(), 1, "{status:?}");
        assert_eq!(status.holders[0].who.as_deref(), Some("new"), "most nodes");
        assert_eq!(status.holders[0].fencing_token, Some(7));
        // Another owner's token with the same value is another holder.
        let other = crate::election::candidate_token("new");
        let views = [
            node(vec![holder(&new, 900, Some(7))], &[]),
            node(vec![holder(&other, 900, Some(7))], &[]),
            node(vec![holder(&new, 900, Some(7))], &[]),
        ];
        assert!(agreed_status("k", 5, 3, &views).holders.is_empty());
    }

    #[test]
    fn an_unsettled_term_is_the_highest_fence_a_quorum_reached() {
        let w = new_token();
        let at = |fence| node(vec![holder(&w, 900, fence)], &[]);
        let views = [at(Some(5)), at(Some(9)), at(Some(7)), at(None)];
        assert_eq!(
            agreed_status("k", 5, 3, &views).holders[0].fencing_token,
            None
        );
        assert_eq!(unsettled_term(3, &views), Some(5));
        assert_eq!(unsettled_term(2, &views), Some(7));
        assert_eq!(
            unsettled_term(3, &[at(Some(9)), at(None), at(None)]),
            Some(9)
        );
        assert_eq!(unsettled_term(3, &[at(None), at(None), at(None)]), None);
        assert_eq!(
            unsettled_term(3, &[at(Some(9)), at(Some(9))]),
            None,
            "no majority"
        );
    }

    #[test]
    fn keys_listed_by_a_quorum() {
        let lists = vec![
            vec!["a".to_owned(), "b".to_owned()],
            vec!["b".to_owned(), "c".to_owned()],
            vec!["b".to_owned(), "a".to_owned()],
        ];
        assert_eq!(agreed_keys(2, lists), ["a", "b"]);
    }
}
