//! Tests of the report: formatting and ratios.

use super::*;

#[test]
fn formatting() {
    assert_eq!(fmt_us(Some(0.25)), "250 ns");
    assert_eq!(fmt_us(Some(3.21)), "3.2 µs");
    assert_eq!(fmt_us(Some(321.0)), "321 µs");
    assert_eq!(fmt_us(Some(1234.0)), "1.23 ms");
    assert_eq!(fmt_us(Some(12345.0)), "12.3 ms");
    assert_eq!(fmt_us(None), "—");
    assert_eq!(fmt_rate(1234567.4), "1,234,567");
    assert_eq!(fmt_rate(999.0), "999");
    assert_eq!(fmt_rate(1000.0), "1,000");
}

#[test]
fn a_round_is_kept_by_its_median_ratio_computed_as_the_report_computes_it() {
    assert_eq!(median_index(&[]), None);
    assert_eq!(median_index(&[1.4]), Some(0));
    assert_eq!(median_index(&[2.58, 1.95, 2.1]), Some(2));
    assert_eq!(median_index(&[1.3, 1.2]), Some(0), "the upper middle one");
    assert_eq!(median_index(&[1.3, 1.2, 1.25, 1.1]), Some(2));

    let mut raw = ScenarioResult::new(Scenario::Raw, 8);
    raw.op = Some("cycle");
    raw.p50_us = Some(50.0);
    raw.per_sec = 30_000.0;
    let mut spread = ScenarioResult::new(Scenario::Spread, 8);
    spread.p50_us = Some(400.0);
    spread.per_sec = 20_000.0;
    assert_eq!(
        round_ratio(&raw, &spread),
        Some(1.5),
        "rates, raw over lock"
    );
    let mut unc = ScenarioResult::new(Scenario::Uncontended, 1);
    unc.p50_us = Some(60.0);
    assert_eq!(round_ratio(&raw, &unc), Some(1.2), "p50s, lock over raw");
    let failed = ScenarioResult::new(Scenario::Spread, 8).failed("down".into(), None);
    assert_eq!(round_ratio(&raw, &failed), None);
}

#[test]
fn ratios_come_from_raw_results_of_the_same_run() {
    let raw = |clients, p50, per_sec| {
        let mut r = ScenarioResult::new(Scenario::Raw, clients);
        r.op = Some("cycle");
        r.p50_us = Some(p50);
        r.per_sec = per_sec;
        r
    };
    let mut unc = ScenarioResult::new(Scenario::Uncontended, 1);
    unc.p50_us = Some(300.0);
    unc.wait_p50_us = Some(120.0);
    let mut spread = ScenarioResult::new(Scenario::Spread, 8);
    spread.per_sec = 2000.0;
    let mut set = ScenarioResult::new(Scenario::Sets, 1);
    set.p50_us = Some(540.0);
    set.wait_p50_us = Some(264.0);
    let mut sets8 = ScenarioResult::new(Scenario::Sets, 8);
    sets8.p50_us = Some(5400.0);
    let mut b = BackendReport {
        backend: Kind::Redis,
        url: String::new(),
        server: String::new(),
        capabilities: Capabilities::default().into(),
        raw_ping: None,
        raw_cycle: "",
        results: vec![
            raw(1, 100.0, 10_000.0),
            raw(8, 50.0, 30_000.0),
            unc,
            spread,
            set,
            sets8,
        ],
    };
    b.compute_ratios();
    assert_eq!(b.results[2].ratio_to_raw, Some(3.0));
    assert_eq!(b.results[3].ratio_to_raw, Some(15.0));
    // An uncontended set of two against two uncontended single keys, same run.
    let set = &b.results[4];
    assert_eq!(set.vs_two_singles, Some(0.9));
    assert_eq!(set.wait_vs_two_singles, Some(1.1));
    assert_eq!(set.ratio_to_raw, None);
    // Only the one-client set is uncontended.
    assert_eq!(b.results[5].vs_two_singles, None);
}

#[test]
fn the_election_table_names_what_each_backend_declares() {
    let backend = |kind, election, result: ScenarioResult| {
        let caps = Caps::from(Capabilities {
            election,
            ..Default::default()
        });
        BackendReport {
            backend: kind,
            url: String::new(),
            server: String::new(),
            capabilities: caps,
            raw_ping: None,
            raw_cycle: "",
            results: vec![result],
        }
    };
    let mut ok = ScenarioResult::new(Scenario::Elections, 8);
    ok.count = 40;
    ok.per_sec = 80.0;
    ok.p50_us = Some(250.0);
    let mut lag = Histogram::default();
    lag.record(Duration::from_micros(40));
    let ok = ok.observed(&lag, 30).fairness(vec![5; 8]);
    assert_eq!(ok.observed_share, Some(0.75));
    let report = report_of(
        vec![8],
        vec![
            backend(
                Kind::Mysql,
                dlock::Observe::Polled {
                    every: Duration::from_millis(250),
                },
                ok,
            ),
            backend(
                Kind::Postgres,
                dlock::Observe::Unsupported,
                ScenarioResult::new(Scenario::Elections, 8).unsupported(),
            ),
        ],
    );
    let md = report.markdown();
    assert!(
        md.contains(
            "| mysql | 8 | 80 | 250 µs | — | 40 µs | 40 µs | 75 % | 1.00 | polled every 250 ms |"
        ),
        "{md}"
    );
    assert!(
        md.contains("mysql's observers are polled every 250 ms: terms of 10 ms may go unseen."),
        "{md}"
    );
    assert!(
        md.contains("| postgres | 8 | no elections | | | | | |  | unsupported |"),
        "{md}"
    );
}

#[test]
fn uncontended_and_spread_rows_show_the_clients_cpu_per_cycle_and_keep_their_columns() {
    let raw = |clients, cpu| {
        let mut r = ScenarioResult::new(Scenario::Raw, clients);
        r.op = Some("cycle");
        r.p50_us = Some(100.0);
        r.per_sec = 10_000.0;
        r.client_cpu_us = Some(cpu);
        r
    };
    let mut unc = ScenarioResult::new(Scenario::Uncontended, 1);
    unc.p50_us = Some(130.0);
    unc.per_sec = 7_000.0;
    unc.client_cpu_us = Some(35.4);
    let failed = ScenarioResult::new(Scenario::Spread, 8).failed("down".into(), None);
    let mut report = report_of(
        vec![1, 8],
        vec![BackendReport {
            backend: Kind::Postgres,
            url: String::new(),
            server: String::new(),
            capabilities: Capabilities::default().into(),
            raw_ping: None,
            raw_cycle: "raw",
            results: vec![raw(1, 20.2), raw(8, 14.0), unc, failed],
        }],
    );
    report.backends[0].compute_ratios();
    let md = report.markdown();
    assert!(md.contains("| 1.30× | 20 → 35 µs |"), "{md}");
    for title in ["### Uncontended", "### Spread"] {
        let table: Vec<&str> = md
            .split(title)
            .nth(1)
            .expect("the table")
            .lines()
            .skip_while(|l| !l.starts_with('|'))
            .take_while(|l| l.starts_with('|'))
            .collect();
        let cells = |line: &str| line.matches('|').count();
        assert!(table.len() >= 3, "{title}: {table:?}");
        for row in &table[1..] {
            assert_eq!(cells(row), cells(table[0]), "{title}: {row}");
        }
    }
}

#[test]
fn client_cpu_is_spread_over_the_operations_counted() {
    let second = Some(Duration::from_secs(1));
    assert_eq!(per_op_us(second, 10_000), Some(100.0));
    assert_eq!(per_op_us(second, 14_000_000), Some(0.07), "to 0.01 µs");
    assert_eq!(per_op_us(second, 0), None);
    assert_eq!(per_op_us(None, 10), None);
}

/// A report of `backends` measured with `clients`, one round of 1 s each.
fn report_of(clients: Vec<usize>, backends: Vec<BackendReport>) -> Report {
    Report {
        lockbench: "test",
        started_unix: 0,
        machine: Machine::detect(),
        config: Config {
            duration_ms: 1000,
            warmup_ms: 0,
            hold_ms: 0,
            ttl_ms: 30_000,
            clients,
            prefix: String::new(),
            hold_many: None,
            hold_for_ms: None,
            rounds: 1,
        },
        backends,
        skipped: vec![],
        failures: vec![],
    }
}
