//! The Markdown tables of the lock workloads, from a [`Report`].

use std::fmt::Write as _;
use std::time::Duration;

use crate::report::{Report, Scenario, Status, failed_cell, fmt_rate, fmt_ratio, fmt_us};

impl Report {
    /// The uncontended, contended, spread, read-mostly, semaphore, key-set and election
    /// tables.
    pub(crate) fn lock_tables(&self, s: &mut String) {
        let _ = writeln!(
            s,
            "\nLatencies are medians (p50) and p99 over the measured window; `× raw` is what the \
             lock costs in units of the server's own minimal round trips, measured in this run \
             (see benches/README.md).\n"
        );

        let _ = writeln!(
            s,
            "### Uncontended: one client, acquire + release of one key\n"
        );
        let _ = writeln!(
            s,
            "| backend | raw ping p50 | raw cycle | raw cycle p50 | cycles/s | p50 | p99 | × raw | client CPU/cycle, raw → lock | rounds |"
        );
        let _ = writeln!(s, "|---|---:|---|---:|---:|---:|---:|---:|---:|---|");
        for b in &self.backends {
            let ping = b
                .find(Scenario::Raw, 1, Some("ping"))
                .and_then(|r| r.p50_us);
            let raw_cycle = b.raw_cycle(1);
            let raw = raw_cycle.and_then(|r| r.p50_us);
            let Some(r) = b.find(Scenario::Uncontended, 1, None) else {
                continue;
            };
            let cells = if r.ok() {
                format!(
                    "{} | {} | {} | {} | {} | {}",
                    fmt_rate(r.per_sec),
                    fmt_us(r.p50_us),
                    fmt_us(r.p99_us),
                    fmt_ratio(r.ratio_to_raw),
                    fmt_cpu(raw_cycle.and_then(|r| r.client_cpu_us), r.client_cpu_us),
                    fmt_rounds(r.round_ratios.as_deref())
                )
            } else {
                format!("{} | | | | |", failed_cell(r))
            };
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {cells} |",
                b.backend,
                fmt_us(ping),
                b.raw_cycle,
                fmt_us(raw),
            );
        }

        let _ = writeln!(s, "\n### Contended: N clients, one key\n");
        let _ = writeln!(
            s,
            "| backend | N | hand-offs/s | hand-off p50 | p99 | × raw | Jain | max wait | wake-ups/acq | fair |"
        );
        let _ = writeln!(s, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|");
        for b in &self.backends {
            for r in b
                .results
                .iter()
                .filter(|r| r.scenario == Scenario::Contended)
            {
                let cells = if r.ok() {
                    format!(
                        "{} | {} | {} | {} | {} | {} | {}",
                        fmt_rate(r.per_sec),
                        fmt_us(r.p50_us),
                        fmt_us(r.p99_us),
                        fmt_ratio(r.ratio_to_raw),
                        r.jain.map_or("—".into(), |j| format!("{j:.2}")),
                        fmt_us(r.max_wait_us),
                        r.wakeups_per_acquire
                            .map_or("—".into(), |w| format!("{w:.2}")),
                    )
                } else {
                    format!("{} | | | | | | ", failed_cell(r))
                };
                let fair = if b.capabilities.fair { "yes" } else { "no" };
                let _ = writeln!(s, "| {} | {} | {cells} | {fair} |", b.backend, r.clients);
            }
        }

        let _ = writeln!(s, "\n### Spread: N clients, N keys\n");
        let _ = writeln!(
            s,
            "| backend | N | cycles/s | raw cycles/s | × raw | p50 | p99 | client CPU/cycle, raw → lock | rounds |"
        );
        let _ = writeln!(s, "|---|---:|---:|---:|---:|---:|---:|---:|---|");
        for b in &self.backends {
            for r in b.results.iter().filter(|r| r.scenario == Scenario::Spread) {
                let raw_cycle = b.raw_cycle(r.clients);
                let raw = raw_cycle.map_or("—".into(), |raw| fmt_rate(raw.per_sec));
                let cells = if r.ok() {
                    format!(
                        "{} | {raw} | {} | {} | {} | {} | {}",
                        fmt_rate(r.per_sec),
                        fmt_ratio(r.ratio_to_raw),
                        fmt_us(r.p50_us),
                        fmt_us(r.p99_us),
                        fmt_cpu(raw_cycle.and_then(|r| r.client_cpu_us), r.client_cpu_us),
                        fmt_rounds(r.round_ratios.as_deref())
                    )
                } else {
                    format!("{} | {raw} | | | | |", failed_cell(r))
                };
                let _ = writeln!(s, "| {} | {} | {cells} |", b.backend, r.clients);
            }
        }
        let _ = writeln!(
            s,
            "\n### Read-mostly: N clients, one key, nine shared holds in ten\n"
        );
        let _ = writeln!(
            s,
            "| backend | N | cycles/s | raw cycles/s | × raw | p50 | p99 | max wait |"
        );
        let _ = writeln!(s, "|---|---:|---:|---:|---:|---:|---:|---:|");
        for b in &self.backends {
            for r in b
                .results
                .iter()
                .filter(|r| r.scenario == Scenario::ReadMostly)
            {
                let raw = b
                    .raw_cycle(r.clients)
                    .map_or("—".into(), |raw| fmt_rate(raw.per_sec));
                let cells = match r.status {
                    Status::Ok => format!(
                        "{} | {raw} | {} | {} | {} | {}",
                        fmt_rate(r.per_sec),
                        fmt_ratio(r.ratio_to_raw),
                        fmt_us(r.p50_us),
                        fmt_us(r.p99_us),
                        fmt_us(r.max_wait_us),
                    ),
                    Status::Unsupported => "no shared holds | | | | | ".into(),
                    Status::Failed => format!("{} | {raw} | | | | ", failed_cell(r)),
                };
                let _ = writeln!(s, "| {} | {} | {cells} |", b.backend, r.clients);
            }
        }
        self.semaphore_table(s);
        self.reentrant_table(s);
        self.sets_table(s);
        self.elections_table(s);
    }

    /// N clients on one key, every hold one of N/4 permits: how many acquisitions a second
    /// the permits allow, how long a client waits for one, and the cap checked.
    fn semaphore_table(&self, s: &mut String) {
        let _ = writeln!(
            s,
            "\n### Semaphore: N clients, one key, N/4 permits\n\n\
             Each hold lasts `--hold`, at least {} ms. *Most at once*: the most holders of the \
             key at the same time over the run, at most the permits (more is a \
             violation and fails the run; fewer means the holds were too short for the protocol to keep \
             every permit busy).\n",
            crate::run::SEMAPHORE_MIN_HOLD.as_millis()
        );
        let _ = writeln!(
            s,
            "| backend | N | permits | acquisitions/s | wait p50 | wait p99 | max wait | most at once |"
        );
        let _ = writeln!(s, "|---|---:|---:|---:|---:|---:|---:|---:|");
        for b in &self.backends {
            for r in b
                .results
                .iter()
                .filter(|r| r.scenario == Scenario::Semaphore)
            {
                let permits = r.permits.map_or("—".into(), |n| n.to_string());
                let cells = match r.status {
                    Status::Ok => format!(
                        "{} | {} | {} | {} | {}",
                        fmt_rate(r.per_sec),
                        fmt_us(r.wait_p50_us),
                        fmt_us(r.wait_p99_us),
                        fmt_us(r.max_wait_us),
                        r.most_holders.map_or("—".into(), |m| m.to_string()),
                    ),
                    Status::Unsupported => "no permits | | | | ".into(),
                    Status::Failed => format!("{} | | | | ", failed_cell(r)),
                };
                let _ = writeln!(s, "| {} | {} | {permits} | {cells} |", b.backend, r.clients);
            }
        }
    }

    /// One client re-entering a key its owner holds: what a re-entry (acquire with the
    /// owner + release, the count raised and lowered on the server) costs, against the
    /// raw round trip and a plain uncontended acquire + release.
    fn reentrant_table(&self, s: &mut String) {
        let _ = writeln!(
            s,
            "\n### Reentrant holds: one client re-entering a key its owner holds\n\n\
             Each cycle re-enters the hold (the same fencing token) and releases the entry; \
             *× uncontended*: against a plain acquire + release of a free key in the same run.\n"
        );
        let _ = writeln!(
            s,
            "| backend | cycles/s | × raw | × uncontended | p50 | p99 |"
        );
        let _ = writeln!(s, "|---|---:|---:|---:|---:|---:|");
        for b in &self.backends {
            let plain = b
                .results
                .iter()
                .find(|r| r.scenario == Scenario::Uncontended && r.ok())
                .and_then(|r| r.p50_us);
            for r in b
                .results
                .iter()
                .filter(|r| r.scenario == Scenario::Reentrant)
            {
                let vs_plain = match (r.p50_us, plain) {
                    (Some(re), Some(plain)) if plain > 0.0 => Some(re / plain),
                    _ => None,
                };
                let cells = match r.status {
                    Status::Ok => format!(
                        "{} | {} | {} | {} | {}",
                        fmt_rate(r.per_sec),
                        fmt_ratio(r.ratio_to_raw),
                        fmt_ratio(vs_plain),
                        fmt_us(r.p50_us),
                        fmt_us(r.p99_us),
                    ),
                    Status::Unsupported => "no reentrant holds | | | | ".into(),
                    Status::Failed => format!("{} | | | | ", failed_cell(r)),
                };
                let _ = writeln!(s, "| {} | {cells} |", b.backend);
            }
        }
    }

    /// N clients on eight keys, each hold a random set of two taken with `acquire_all`: how
    /// many sets a second, how long `acquire_all` waits, and what one uncontended set costs
    /// against two single keys.
    fn sets_table(&self, s: &mut String) {
        let _ = writeln!(
            s,
            "\n### Key sets: N clients, {keys} keys, each hold a random set of {size} (`acquire_all`)\n\n\
             Keys named in random order, taken one by one in ascending order; each set held \
             `--hold`. *Wait*: `acquire_all` call → return. *Cycle*: `acquire_all` call → set \
             released. *vs 2 × one key* (N = 1, no contention): the set's cycle p50 ÷ twice \
             the uncontended single-key cycle p50 of this run (in brackets the same for \
             `acquire_all` ÷ twice `acquire`); about 1 means a set costs its keys one by one. \
             Every key of every set is checked for two holders at once.\n",
            keys = crate::sets::KEYS,
            size = crate::sets::SET_SIZE,
        );
        let _ = writeln!(
            s,
            "| backend | N | sets/s | cycle p50 | wait p50 | wait p99 | max wait | Jain | vs 2 × one key |"
        );
        let _ = writeln!(s, "|---|---:|---:|---:|---:|---:|---:|---:|---:|");
        for b in &self.backends {
            for r in b.results.iter().filter(|r| r.scenario == Scenario::Sets) {
                let cells = if r.ok() {
                    let vs = match (r.vs_two_singles, r.wait_vs_two_singles) {
                        (Some(cycle), Some(wait)) => format!("{cycle:.2}× ({wait:.2}×)"),
                        (cycle, _) => fmt_ratio(cycle),
                    };
                    format!(
                        "{} | {} | {} | {} | {} | {} | {vs}",
                        fmt_rate(r.per_sec),
                        fmt_us(r.p50_us),
                        fmt_us(r.wait_p50_us),
                        fmt_us(r.wait_p99_us),
                        fmt_us(r.max_wait_us),
                        r.jain.map_or("—".into(), |j| format!("{j:.2}")),
                    )
                } else {
                    format!("{} | | | | | | ", failed_cell(r))
                };
                let _ = writeln!(s, "| {} | {} | {cells} |", b.backend, r.clients);
            }
        }
    }

    /// N candidates in one election and one observer: how many terms a second, how long a
    /// hand-over takes, and how soon (and whether) the observer sees each new leader.
    fn elections_table(&self, s: &mut String) {
        let hold = Duration::from_millis(self.config.hold_ms).max(crate::elections::MIN_HOLD);
        let _ = writeln!(
            s,
            "\n### Elections: N candidates, one key, one observer\n\n\
             Each candidate loops `campaign` → lead {hold} (the longer of `--hold` and {min}) → \
             `resign`; one more client follows with `Election::observe`. *Hand-over*: a \
             leader's `resign` call → the next leader's `campaign` returned. *Lag*: a \
             `campaign` returned → the observer reported that term (0 when it saw it first). \
             *Seen*: the share of the window's terms the observer reported at all. *Observe*: \
             what the backend declares; one that polls reads the leader once a period and \
             misses a term shorter than that. Every leadership is checked for two leaders at \
             once.",
            hold = crate::elections::period(hold),
            min = crate::elections::period(crate::elections::MIN_HOLD),
        );
        // Say where *seen* measures the polling period more than the backend's speed.
        for b in &self.backends {
            let observe = &b.capabilities.election;
            if observe.starts_with("polled") && hold < Duration::from_secs(1) {
                let _ = writeln!(
                    s,
                    "{}'s observers are {observe}: terms of {} may go unseen.",
                    b.backend,
                    crate::elections::period(hold)
                );
            }
        }
        let _ = writeln!(
            s,
            "\n| backend | N | terms/s | hand-over p50 | hand-over p99 | lag p50 | lag p99 | seen | Jain | observe |"
        );
        let _ = writeln!(s, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|");
        for b in &self.backends {
            for r in b
                .results
                .iter()
                .filter(|r| r.scenario == Scenario::Elections)
            {
                let cells = match r.status {
                    Status::Ok => format!(
                        "{} | {} | {} | {} | {} | {} | {}",
                        fmt_rate(r.per_sec),
                        fmt_us(r.p50_us),
                        fmt_us(r.p99_us),
                        fmt_us(r.lag_p50_us),
                        fmt_us(r.lag_p99_us),
                        r.observed_share
                            .map_or("—".into(), |x| format!("{:.0} %", x * 100.0)),
                        r.jain.map_or("—".into(), |j| format!("{j:.2}")),
                    ),
                    Status::Unsupported => "no elections | | | | | | ".into(),
                    Status::Failed => format!("{} | | | | | | ", failed_cell(r)),
                };
                let _ = writeln!(
                    s,
                    "| {} | {} | {cells} | {} |",
                    b.backend, r.clients, b.capabilities.election
                );
            }
        }
    }
}

/// `14 → 35 µs`: the raw cycle's client CPU per cycle, then the lock's.
fn fmt_cpu(raw: Option<f64>, lock: Option<f64>) -> String {
    let one = |us: Option<f64>| match us {
        Some(us) if us < 10.0 => format!("{us:.1}"),
        Some(us) => format!("{us:.0}"),
        None => "—".into(),
    };
    format!("{} → {} µs", one(raw), one(lock))
}

/// Each round's ratio, in the order measured (`1.21, 1.33, 1.25`), or `—`.
fn fmt_rounds(ratios: Option<&[f64]>) -> String {
    match ratios {
        Some(ratios) if !ratios.is_empty() => ratios
            .iter()
            .map(|r| format!("{r:.2}"))
            .collect::<Vec<_>>()
            .join(", "),
        _ => "—".into(),
    }
}
