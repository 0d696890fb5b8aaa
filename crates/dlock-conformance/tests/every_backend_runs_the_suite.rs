//! No backend is left untested: every backend crate must have `tests/conformance.rs`
//! calling `dlock_conformance::conformance!` with a module named after the backend.

use std::path::Path;

/// Crates under `crates/` that are not backends.
const NOT_BACKENDS: &[&str] = &[
    "dlock-core",
    "dlock-conformance",
    "dlock",
    "dlock-cli",
    "dlock-torture",
    "dlock-fence",
];

#[test]
fn every_backend_crate_calls_the_conformance_macro() {
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut backends = Vec::new();
    for entry in std::fs::read_dir(&crates).expect("read crates/") {
        let dir = entry.expect("dir entry").path();
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        if !dir.join("Cargo.toml").exists() || NOT_BACKENDS.contains(&name.as_str()) {
            continue;
        }
        let suite = dir.join("tests/conformance.rs");
        let text = std::fs::read_to_string(&suite)
            .unwrap_or_else(|_| panic!("{name} is a backend crate without tests/conformance.rs"));
        let module = name.strip_prefix("dlock-").unwrap_or(&name);
        let call = format!("dlock_conformance::conformance!({module},");
        let called = text
            .lines()
            .map(str::trim_start)
            .any(|line| !line.starts_with("//") && line.starts_with(&call));
        assert!(
            called,
            "{} does not call {call} …) (outside a comment)",
            suite.display()
        );
        backends.push(name);
    }
    assert!(
        backends.contains(&"dlock-memory".to_owned()),
        "found {backends:?}"
    );
}

/// Every scenario written in any file of the `scenarios` module (`src/scenarios/*.rs`) is one
/// the `conformance!` macro stamps, so a new scenario cannot be forgotten by every backend at
/// once.
#[test]
fn the_macro_runs_every_scenario() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let dir = src.join("scenarios");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
        .map(|entry| entry.expect("dir entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "rs"))
        .collect();
    files.sort();
    assert!(
        files.len() >= 2 && files.contains(&dir.join("mod.rs")),
        "found {files:?}"
    );
    let scenarios: Vec<String> = files
        .iter()
        .map(|path| {
            std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
        })
        .collect();
    let lib = std::fs::read_to_string(src.join("lib.rs")).expect("read lib.rs");
    let start = lib
        .find("macro_rules! conformance")
        .expect("the conformance macro");
    let list = &lib[start..];
    let list = &list[..list.find("\n}").unwrap_or(list.len())];
    let stamped: Vec<&str> = list
        .lines()
        .map(|l| l.trim().trim_end_matches(','))
        .collect();
    let written: Vec<&str> = scenarios
        .iter()
        .flat_map(|text| text.lines())
        .filter_map(|l| l.strip_prefix("pub async fn "))
        .filter_map(|l| l.split_once("(cx: Ctx)").map(|(name, _)| name))
        .collect();
    assert!(written.len() >= 20, "found only {written:?}");
    for name in &written {
        assert!(
            stamped.contains(name),
            "scenario {name} is not in the conformance! macro's list"
        );
    }
}
