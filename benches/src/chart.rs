//! The SVG chart: four panels comparing the backends, each lock figure next to the raw
//! figure of the same server. Plotters' SVG backend writes `<text>` elements and sizes them
//! with its built-in estimate, so no system font (or fontconfig) is needed.

use std::path::Path;

use plotters::prelude::*;

use crate::report::{Report, Scenario};

const LOCK: RGBColor = RGBColor(0x1f, 0x77, 0xb4);
const RAW: RGBColor = RGBColor(0xb0, 0xb0, 0xb0);

/// One panel: a value per backend for the lock and (optionally) for the raw baseline.
struct Panel {
    title: String,
    unit: &'static str,
    /// Where the legend goes: latencies are low on the left (memory), rates on the right.
    legend: SeriesLabelPosition,
    bars: Vec<(String, Option<f64>, Option<f64>)>,
}

fn panels(report: &Report) -> Vec<Panel> {
    let max_n = |scenario| {
        report
            .backends
            .iter()
            .flat_map(|b| &b.results)
            .filter(|r| r.scenario == scenario)
            .map(|r| r.clients)
            .max()
            .unwrap_or(1)
    };
    let (nc, ns) = (max_n(Scenario::Contended), max_n(Scenario::Spread));
    let lock = |b: &crate::report::BackendReport, scenario, n, rate: bool| {
        b.results
            .iter()
            .find(|r| r.scenario == scenario && r.clients == n && r.error.is_none())
            .and_then(|r| if rate { Some(r.per_sec) } else { r.p50_us })
    };
    let mut out = vec![
        Panel {
            title: "uncontended acquire+release, p50".into(),
            unit: "µs (log)",
            legend: SeriesLabelPosition::UpperLeft,
            bars: vec![],
        },
        Panel {
            title: format!("contended hand-off ({nc} clients), p50"),
            unit: "µs (log)",
            legend: SeriesLabelPosition::UpperLeft,
            bars: vec![],
        },
        Panel {
            title: format!("contended hand-offs/s ({nc} clients)"),
            unit: "per second (log)",
            legend: SeriesLabelPosition::UpperRight,
            bars: vec![],
        },
        Panel {
            title: format!("spread cycles/s ({ns} clients, {ns} keys)"),
            unit: "per second (log)",
            legend: SeriesLabelPosition::UpperRight,
            bars: vec![],
        },
    ];
    for b in &report.backends {
        let name = b.backend.to_string();
        let raw_p50 = b.raw_cycle(1).and_then(|r| r.p50_us);
        out[0].bars.push((
            name.clone(),
            lock(b, Scenario::Uncontended, 1, false),
            raw_p50,
        ));
        out[1].bars.push((
            name.clone(),
            lock(b, Scenario::Contended, nc, false),
            raw_p50,
        ));
        out[2].bars.push((
            name.clone(),
            lock(b, Scenario::Contended, nc, true),
            b.raw_cycle(1).map(|r| r.per_sec),
        ));
        out[3].bars.push((
            name,
            lock(b, Scenario::Spread, ns, true),
            b.raw_cycle(ns).map(|r| r.per_sec),
        ));
    }
    out
}

/// Write the chart to `path`.
pub(crate) fn write(report: &Report, path: &Path) -> Result<(), String> {
    draw(report, path).map_err(|e| format!("chart {}: {e}", path.display()))
}

fn draw(report: &Report, path: &Path) -> Result<(), Box<dyn std::error::Error>> {
    let root = SVGBackend::new(path, (1200, 820)).into_drawing_area();
    root.fill(&WHITE)?;
    let title = format!(
        "lockbench {}: {} cores, {} — blue: lock, grey: the server's raw round trips",
        report.lockbench, report.machine.cores, report.machine.cpu
    );
    let root = root.titled(&title, ("sans-serif", 18))?;
    for (area, panel) in root.split_evenly((2, 2)).iter().zip(panels(report)) {
        let values: Vec<f64> = panel
            .bars
            .iter()
            .flat_map(|(_, a, b)| [*a, *b])
            .flatten()
            .filter(|v| *v > 0.0)
            .collect();
        let n = panel.bars.len().max(1);
        let (lo, hi) = values
            .iter()
            .fold((f64::MAX, f64::MIN), |(lo, hi), v| (lo.min(*v), hi.max(*v)));
        let (lo, hi) = if values.is_empty() {
            (1.0, 10.0)
        } else {
            (lo / 3.0, hi * 20.0)
        };
        let names: Vec<String> = panel.bars.iter().map(|(n, _, _)| n.clone()).collect();
        let mut chart = ChartBuilder::on(area)
            .caption(&panel.title, ("sans-serif", 16))
            .margin(12)
            .x_label_area_size(28)
            .y_label_area_size(70)
            .build_cartesian_2d(-0.5f64..(n as f64 - 0.5), (lo..hi).log_scale())?;
        let label = |x: &f64| {
            let i = x.round();
            if (x - i).abs() < 1e-6 && i >= 0.0 {
                names.get(i as usize).cloned().unwrap_or_default()
            } else {
                String::new()
            }
        };
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(n)
            .x_label_formatter(&label)
            .y_desc(panel.unit)
            .y_label_formatter(&|v| short(*v))
            .draw()?;
        let raw_bars = panel
            .bars
            .iter()
            .enumerate()
            .filter_map(|(i, (_, _, raw))| {
                raw.map(|v| Rectangle::new([(i as f64 - 0.38, lo), (i as f64, v)], RAW.filled()))
            });
        chart
            .draw_series(raw_bars)?
            .label("raw")
            .legend(|(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], RAW.filled()));
        let lock_bars = panel
            .bars
            .iter()
            .enumerate()
            .filter_map(|(i, (_, lock, _))| {
                lock.map(|v| Rectangle::new([(i as f64, lo), (i as f64 + 0.38, v)], LOCK.filled()))
            });
        chart
            .draw_series(lock_bars)?
            .label("lock")
            .legend(|(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], LOCK.filled()));
        chart
            .configure_series_labels()
            .position(panel.legend)
            .border_style(BLACK)
            .background_style(WHITE.mix(0.8))
            .draw()?;
    }
    root.present()?;
    Ok(())
}

/// `1.2k`, `34M`, `0.5`.
fn short(v: f64) -> String {
    let (v, suffix) = if v >= 1e6 {
        (v / 1e6, "M")
    } else if v >= 1e3 {
        (v / 1e3, "k")
    } else {
        (v, "")
    };
    if v >= 10.0 || v.fract() == 0.0 {
        format!("{v:.0}{suffix}")
    } else {
        format!("{v:.1}{suffix}")
    }
}
