//! `dlock status`: who holds a key and who waits for it, as lines of text or one JSON
//! object, read from the server without taking or changing anything.

use std::time::{Duration, SystemTime};

use dlock::{HolderStatus, KeyStatus, LockError, Mode, WaiterStatus};
use serde::Serialize;

use crate::args::StatusArgs;
use crate::output::{json_line, out, shown_key};

pub(crate) async fn status(args: StatusArgs) -> Result<u8, LockError> {
    let url = args.source.url()?;
    let lock = dlock::connect(&url).await?;
    let status = lock.inspect(&args.key).await?;
    match args.json {
        true => {
            use std::io::Write as _;
            let mut stdout = std::io::stdout().lock();
            let _ = writeln!(stdout, "{}", json_line(&as_json(&status)));
            let _ = stdout.flush();
        }
        false => {
            for line in as_text(&status) {
                out!("{line}");
            }
        }
    }
    Ok(0)
}

/// The text form: `key: K`, one `holder: …` line per hold (or `holder: none`), then one
/// `waiter N: …` line per waiter, `waiters: none`, or `waiters: not visible on this
/// backend`. Fields the backend does not know are left out.
pub(crate) fn as_text(status: &KeyStatus) -> Vec<String> {
    let mut lines = vec![format!("key: {}", shown_key(&status.key))];
    if status.holders.is_empty() {
        lines.push("holder: none".to_owned());
    }
    for holder in &status.holders {
        let mut line = format!("holder: {}", mode_text(holder.mode));
        if let Some(token) = holder.fencing_token {
            line.push_str(&format!(" token={token}"));
        }
        push_since(&mut line, holder.since);
        if let Some(ttl) = holder.ttl_left {
            line.push_str(&format!(" ttl_left={}", seconds(ttl)));
        }
        push_who(&mut line, holder.who.as_deref());
        lines.push(line);
    }
    match &status.waiters {
        None => lines.push("waiters: not visible on this backend".to_owned()),
        Some(waiters) if waiters.is_empty() => lines.push("waiters: none".to_owned()),
        Some(waiters) => {
            for (n, waiter) in waiters.iter().enumerate() {
                let mode = waiter.mode.map_or_else(|| "?".to_owned(), mode_text);
                let mut line = format!("waiter {}: {mode}", n + 1);
                push_since(&mut line, waiter.since);
                push_who(&mut line, waiter.who.as_deref());
                lines.push(line);
            }
        }
    }
    lines
}

/// ` since=…` where known (and writable in RFC 3339).
fn push_since(line: &mut String, since: Option<SystemTime>) {
    if let Some(since) = since.and_then(|t| rfc3339(t, false)) {
        line.push_str(&format!(" since={since}"));
    }
}

/// ` who=…` where known, shown as a key is, so that it cannot add a field or a line.
fn push_who(line: &mut String, who: Option<&str>) {
    if let Some(who) = who {
        line.push_str(&format!(" who={}", shown_key(who)));
    }
}

/// The JSON form, fields in this order: `{"key", "holders": [...], "waiters": [...] |
/// null}`; each holder `{"mode", "permits", "fencing_token", "since", "ttl_left_ms",
/// "who"}`, each waiter `{"mode", "permits", "since", "who"}`, unknown fields `null`.
#[derive(Debug, Serialize)]
pub(crate) struct StatusJson<'a> {
    key: &'a str,
    holders: Vec<HolderJson<'a>>,
    waiters: Option<Vec<WaiterJson<'a>>>,
}

#[derive(Debug, Serialize)]
struct HolderJson<'a> {
    mode: &'static str,
    permits: Option<u32>,
    fencing_token: Option<u64>,
    since: Option<String>,
    ttl_left_ms: Option<u64>,
    who: Option<&'a str>,
}

#[derive(Debug, Serialize)]
struct WaiterJson<'a> {
    mode: Option<&'static str>,
    permits: Option<u32>,
    since: Option<String>,
    who: Option<&'a str>,
}

pub(crate) fn as_json(status: &KeyStatus) -> StatusJson<'_> {
    StatusJson {
        key: &status.key,
        holders: status.holders.iter().map(holder_json).collect(),
        waiters: status
            .waiters
            .as_ref()
            .map(|waiters| waiters.iter().map(waiter_json).collect()),
    }
}

fn holder_json(holder: &HolderStatus) -> HolderJson<'_> {
    HolderJson {
        mode: holder.mode.as_str(),
        permits: permits(holder.mode),
        fencing_token: holder.fencing_token,
        since: holder.since.and_then(|t| rfc3339(t, true)),
        ttl_left_ms: holder
            .ttl_left
            .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
        who: holder.who.as_deref(),
    }
}

fn waiter_json(waiter: &WaiterStatus) -> WaiterJson<'_> {
    WaiterJson {
        mode: waiter.mode.map(Mode::as_str),
        permits: waiter.mode.and_then(permits),
        since: waiter.since.and_then(|t| rfc3339(t, true)),
        who: waiter.who.as_deref(),
    }
}

/// `exclusive`, `shared`, `permits(N)`, or `permits` where the server does not store N.
fn mode_text(mode: Mode) -> String {
    match mode {
        Mode::Permits(0) => "permits".to_owned(),
        mode => mode.to_string(),
    }
}

/// A permit hold's limit, where the server stores it.
fn permits(mode: Mode) -> Option<u32> {
    match mode {
        Mode::Permits(n) if n > 0 => Some(n),
        _ => None,
    }
}

/// `12.3s`: a duration in seconds, to a tenth.
fn seconds(d: Duration) -> String {
    format!("{:.1}s", d.as_secs_f64())
}

/// A time in RFC 3339, UTC (`2026-11-26T17:01:02Z`, or with milliseconds); `None` for a
/// time RFC 3339 cannot write (before 1970 or after 9999), which a server's clock or a
/// corrupt record could give.
fn rfc3339(time: SystemTime, millis: bool) -> Option<String> {
    const YEAR_10000: Duration = Duration::from_secs(253_402_300_800);
    let since_epoch = time.duration_since(SystemTime::UNIX_EPOCH).ok()?;
    if since_epoch >= YEAR_10000 {
        return None;
    }
    Some(match millis {
        true => humantime::format_rfc3339_millis(time).to_string(),
        false => humantime::format_rfc3339_seconds(time).to_string(),
    })
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;

    fn at(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
    }

    fn sample() -> KeyStatus {
        let mut status = KeyStatus::new("invoices/2026-11", true);
        let mut holder = HolderStatus::new(Mode::Exclusive);
        holder.fencing_token = Some(42);
        holder.since = Some(at(1_795_712_462) + Duration::from_millis(250));
        holder.ttl_left = Some(Duration::from_millis(12_340));
        holder.who = Some("billing@host-1:4242".to_owned());
        status.holders.push(holder);
        let mut waiter = WaiterStatus::new();
        waiter.mode = Some(Mode::Exclusive);
        waiter.who = Some("billing@host-2:77".to_owned());
        status.waiters.as_mut().unwrap().push(waiter);
        status.waiters.as_mut().unwrap().push(WaiterStatus::new());
        status
    }

    #[test]
    fn text_shows_holders_then_waiters_in_order() {
        assert_eq!(
            as_text(&sample()),
            [
                "key: invoices/2026-11",
                "holder: exclusive token=42 since=2026-11-26T17:01:02Z ttl_left=12.3s who=billing@host-1:4242",
                "waiter 1: exclusive who=billing@host-2:77",
                "waiter 2: ?",
            ]
        );
    }

    #[test]
    fn text_of_a_free_key_and_of_hidden_waiters() {
        assert_eq!(
            as_text(&KeyStatus::new("k", true)),
            ["key: k", "holder: none", "waiters: none"]
        );
        let mut status = KeyStatus::new("a b\n", false);
        status.holders.push(HolderStatus::new(Mode::Shared));
        status.holders.push(HolderStatus::new(Mode::Permits(0)));
        let mut third = HolderStatus::new(Mode::Permits(3));
        third.who = Some("10.0.0.7:5123 conn\n2".to_owned());
        third.since = Some(at(0).checked_sub(Duration::from_secs(1)).unwrap());
        status.holders.push(third);
        assert_eq!(
            as_text(&status),
            [
                r#"key: "a b\n""#,
                "holder: shared",
                "holder: permits",
                r#"holder: permits(3) who="10.0.0.7:5123 conn\n2""#,
                "waiters: not visible on this backend",
            ]
        );
    }

    #[test]
    fn json_has_every_field_and_null_for_the_unknown() {
        let value = serde_json::to_value(as_json(&sample())).unwrap();
        assert_eq!(
            value,
            json!({
                "key": "invoices/2026-11",
                "holders": [{
                    "mode": "exclusive",
                    "permits": null,
                    "fencing_token": 42,
                    "since": "2026-11-26T17:01:02.250Z",
                    "ttl_left_ms": 12340,
                    "who": "billing@host-1:4242",
                }],
                "waiters": [
                    {"mode": "exclusive", "permits": null, "since": null, "who": "billing@host-2:77"},
                    {"mode": null, "permits": null, "since": null, "who": null},
                ],
            })
        );
        let mut status = KeyStatus::new("k", false);
        status.holders.push(HolderStatus::new(Mode::Permits(4)));
        let value = serde_json::to_value(as_json(&status)).unwrap();
        assert_eq!(value["waiters"], Value::Null);
        assert_eq!(value["holders"][0]["mode"], "permits");
        assert_eq!(value["holders"][0]["permits"], 4);
        assert_eq!(value["holders"][0]["since"], Value::Null);
    }

    #[test]
    fn json_fields_come_in_the_documented_order() {
        let mut status = KeyStatus::new("k", true);
        status.holders.push(HolderStatus::new(Mode::Shared));
        status.waiters.as_mut().unwrap().push(WaiterStatus::new());
        assert_eq!(
            json_line(&as_json(&status)),
            concat!(
                r#"{"key":"k","holders":[{"mode":"shared","permits":null,"fencing_token":null,"#,
                r#""since":null,"ttl_left_ms":null,"who":null}],"#,
                r#""waiters":[{"mode":null,"permits":null,"since":null,"who":null}]}"#
            )
        );
    }

    #[test]
    fn times_rfc3339_cannot_write_are_left_out() {
        assert_eq!(
            rfc3339(at(0), false).as_deref(),
            Some("1970-01-01T00:00:00Z")
        );
        assert_eq!(rfc3339(at(253_402_300_800), true), None);
        assert_eq!(
            rfc3339(at(0).checked_sub(Duration::from_secs(1)).unwrap(), true),
            None
        );
    }
}
