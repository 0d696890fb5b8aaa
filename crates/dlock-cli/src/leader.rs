//! `dlock leader`: who leads an election, once or at each change (`--watch`), as lines of
//! text or JSON lines.

use dlock::{Election, Leader, LockError};
use futures::StreamExt as _;
use serde::Serialize;

use crate::args::LeaderArgs;
use crate::output::{json_line, out, shown_key};
use crate::take::Signals;

pub(crate) async fn leader(args: LeaderArgs) -> Result<u8, LockError> {
    let url = args.source.url()?;
    let mut signals = Signals::install();
    let lock = dlock::connect(&url).await?;
    let election = Election::new(lock, args.key.clone());
    let show = |leader: &Option<Leader>| match args.json {
        true => out!("{}", json_line(&as_json(&args.key, leader.as_ref()))),
        false => out!("{}", as_text(leader.as_ref())),
    };
    if !args.watch {
        show(&election.leader().await?);
        return Ok(0);
    }
    let mut changes = election.observe();
    loop {
        tokio::select! {
            change = changes.next() => match change {
                Some(change) => show(&change?),
                None => return Ok(0),
            },
            _ = signals.next() => return Ok(0),
        }
    }
}

/// `leader: <value> term=<n>`, or `leader: none`; the value shown as keys are.
fn as_text(leader: Option<&Leader>) -> String {
    match leader {
        Some(l) => format!("leader: {} term={}", shown_key(&l.value), l.term),
        None => "leader: none".to_owned(),
    }
}

#[derive(Serialize)]
struct LeaderJson<'a> {
    key: &'a str,
    leader: Option<LeaderFields<'a>>,
}

#[derive(Serialize)]
struct LeaderFields<'a> {
    value: &'a str,
    term: u64,
}

fn as_json<'a>(key: &'a str, leader: Option<&'a Leader>) -> LeaderJson<'a> {
    LeaderJson {
        key,
        leader: leader.map(|l| LeaderFields {
            value: &l.value,
            term: l.term,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_leader_reads_as_one_line() {
        assert_eq!(as_text(None), "leader: none");
        let l = Leader::new("10.0.0.7:8080", 42);
        assert_eq!(as_text(Some(&l)), "leader: 10.0.0.7:8080 term=42");
        let spaced = Leader::new("host a", 7);
        assert_eq!(as_text(Some(&spaced)), "leader: \"host a\" term=7");
        assert_eq!(
            json_line(&as_json("k", Some(&l))),
            r#"{"key":"k","leader":{"value":"10.0.0.7:8080","term":42}}"#
        );
        assert_eq!(
            json_line(&as_json("k", None)),
            r#"{"key":"k","leader":null}"#
        );
    }
}
