//! `dlock run --owner`: reentrant holds across processes.

use super::*;

/// `dlock run --owner` is reentrant: a nested `dlock run` of the command (which inherits
/// DLOCK_OWNER) takes the key at once with the same token, where a plain nested run is
/// refused with 75; a `dlock hold --owner` in another process lets a run of the same owner
/// in and keeps every other owner out.
pub(super) fn nested_runs_of_one_owner_reenter(url: &str) {
    let key = unique("owner");
    let nested = |flags: &str| {
        format!(
            "'{DLOCK}' run --url '{url}' --key '{key}' --no-wait {flags} -- \
             sh -c 'echo \"inner=$DLOCK_FENCING_TOKEN $DLOCK_OWNER\"'; \
             echo \"nested=$?\"; echo \"outer=$DLOCK_FENCING_TOKEN\""
        )
    };
    let outer = |owner: Option<&str>| {
        let mut command = Command::new(DLOCK);
        command.args(["run", "--url", url, "--key", &key, "--no-wait"]);
        if let Some(id) = owner {
            command.args(["--owner", id]);
        }
        let script = nested("");
        let out = command
            .args(["--", "sh", "-c", &script])
            .env_remove("DLOCK_OWNER")
            .output()
            .expect("run dlock");
        assert!(out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let owned = outer(Some("job-7"));
    let value = |text: &str, name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .unwrap_or_else(|| panic!("no {name} line in {text:?}"))
            .to_owned()
    };
    assert_eq!(value(&owned, "nested="), "0", "{owned}");
    let outer_token = value(&owned, "outer=");
    assert_eq!(
        value(&owned, "inner="),
        format!("{outer_token} job-7"),
        "{owned}"
    );
    let plain = outer(None);
    assert_eq!(
        value(&plain, "nested="),
        "75",
        "a plain nested run waits for its parent: {plain}"
    );

    let (mut holder, token) = hold(url, &key, &["--owner", "job-8"]);
    let same = Command::new(DLOCK)
        .args([
            "run",
            "--url",
            url,
            "--key",
            &key,
            "--no-wait",
            "--",
            "sh",
            "-c",
        ])
        .arg("echo $DLOCK_FENCING_TOKEN")
        .env("DLOCK_OWNER", "job-8")
        .output()
        .expect("run dlock");
    assert!(
        same.status.success(),
        "the holder's owner re-enters: {same:?}"
    );
    assert_eq!(
        String::from_utf8_lossy(&same.stdout).trim(),
        token.to_string()
    );
    for other in [&["--owner", "job-9"][..], &[]] {
        let out = run_true(url, &key, &[&["--no-wait"][..], other].concat());
        assert_eq!(
            out.status.code(),
            Some(75),
            "{other:?} while job-8 holds: {out:?}"
        );
    }
    common::sigterm(&holder);
    assert!(holder.wait().unwrap().success());
    let bad = run_true(url, &key, &["--owner", "job 8", "--no-wait"]);
    assert_eq!(bad.status.code(), Some(64), "{bad:?}");
}
