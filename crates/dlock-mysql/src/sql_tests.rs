//! The statements' text: names, literals, and each server's spelling.

use super::*;
use std::collections::HashSet;

#[test]
fn names_are_readable_fit_and_never_collide() {
    let keys = [
        "A".to_owned(),
        "a".to_owned(),
        "a ".to_owned(),
        "a%20".to_owned(),
        "orders/42".to_owned(),
        "it's".to_owned(),
        "back\\slash".to_owned(),
        "x'; DROP TABLE t; --".to_owned(),
        "caf\u{e9}".to_owned(),
        "caf%C3%A9".to_owned(),
        "k".repeat(1024),
        format!("{}x", "k".repeat(1023)),
    ];
    let names: HashSet<_> = keys.iter().map(|k| row_name(k)).collect();
    assert_eq!(names.len(), keys.len());
    for name in &names {
        assert!(name.len() <= NAME_WIDTH, "{name}");
        assert!(name.bytes().all(|b| b.is_ascii_graphic()), "{name}");
        assert!(!name.contains(['\'', '\\', '`', '"']), "{name}");
    }
    assert_eq!(row_name("orders/42"), "orders/42");
    assert!(row_name(&"k".repeat(1024)).starts_with("kkkk"));
}

#[test]
fn literals_are_hex() {
    assert_eq!(literal("a'b"), "X'612762'");
    assert_eq!(literal(""), "X''");
}

#[test]
fn idle_timeout_rounds_up_to_whole_seconds() {
    assert_eq!(idle_seconds(Duration::from_millis(100)), 1);
    assert_eq!(idle_seconds(Duration::from_secs(2)), 2);
    assert_eq!(idle_seconds(Duration::from_millis(2001)), 3);
    assert_eq!(idle_seconds(Duration::from_secs(86_400)), 86_400);
}

const HOLDER: Holder<'static> = Holder {
    key: "k",
    who: "w@h:1",
};

#[test]
fn statements_name_the_configured_tables() {
    let sql = Sql::new("my_locks", Tokens::Sequence, Server::MariaDb);
    assert!(sql.create_tables().contains("`my_locks_fence`"));
    assert!(
        sql.create_sequence(7)
            .contains("`my_locks_seq` START WITH 7")
    );
    assert!(
        sql.try_take("k", X, Some(2), false, HOLDER)
            .contains("NEXTVAL(`my_locks_seq`)")
    );
    assert!(
        sql.try_take("k", X, Some(2), true, HOLDER)
            .contains("ROLLBACK;INSERT")
    );
    assert!(
        sql.try_take("k", X, None, false, HOLDER)
            .starts_with("BEGIN;")
    );
    assert!(
        sql.wait_take("k", X, Some(3), HOLDER)
            .starts_with("SET SESSION wait_timeout = 3;")
    );
    assert!(sql.next_fence("k", 9).contains("NEXTVAL(`my_locks_seq`)"));
    let counter = Sql::new("my_locks", Tokens::Counter, Server::MySql);
    assert!(
        !counter
            .try_take("k", X, Some(2), false, HOLDER)
            .contains("NEXTVAL")
    );
    assert!(counter.next_fence("k", 9).contains("fence + 1"));
    assert_eq!(Sql::finish(End::Release, false), "ROLLBACK");
    assert_eq!(Sql::finish(End::Release, true).matches(';').count(), 1);
}

const X: Mode = Mode::Exclusive;
const S: Mode = Mode::Shared;

#[test]
fn each_server_gets_its_own_spelling_of_the_shared_row_lock() {
    let mariadb = Sql::new("t", Tokens::Sequence, Server::MariaDb);
    let mysql = Sql::new("t", Tokens::Counter, Server::MySql);
    let spellings = [
        (&mariadb, X, "FOR UPDATE"),
        (&mariadb, S, "LOCK IN SHARE MODE"),
        (&mysql, X, "FOR UPDATE"),
        (&mysql, S, "FOR SHARE"),
    ];
    for (sql, mode, lock) in spellings {
        let tried = sql.try_take("k", mode, None, false, HOLDER);
        let waited = sql.wait_take("k", mode, None, HOLDER);
        // MariaDB records the hold in the locking statement; MySQL 8 right after it
        // in a try, and in a statement of its own after a wait.
        let recorded = match sql.records_in_lock() {
            true => " RETURNING token",
            false => "",
        };
        assert!(
            tried.contains(&format!(" {lock} NOWAIT{recorded}")),
            "{tried}"
        );
        assert!(waited.ends_with(&format!(" {lock}{recorded}")), "{waited}");
        assert_eq!(tried.matches("INSERT INTO `t_held`").count(), 1, "{tried}");
        let in_wait = usize::from(sql.records_in_lock());
        assert_eq!(waited.matches("INSERT INTO `t_held`").count(), in_wait);
    }
    assert_eq!(
        Server::of_version("10.11.14-MariaDB-0+deb12u2"),
        Server::MariaDb
    );
    assert_eq!(Server::of_version("8.0.36"), Server::MySql);
}

#[test]
fn only_a_server_that_records_in_the_lock_gets_the_prepared_take() {
    let mariadb = Sql::new("t", Tokens::Sequence, Server::MariaDb).with_prepared_take();
    assert!(mariadb.autocommit_off());
    for (mode, lock) in [(X, "FOR UPDATE NOWAIT"), (S, "LOCK IN SHARE MODE NOWAIT")] {
        let take = mariadb.prepared_take(mode).expect("prepared");
        // One statement that starts the transaction itself, with the three values bound.
        assert!(take.starts_with("INSERT INTO `t_held`"), "{take}");
        assert!(!take.contains(';') && !take.contains("X'"), "{take}");
        assert_eq!(take.matches('?').count(), 3, "{take}");
        assert!(take.ends_with(&format!("WHERE name = ? {lock} RETURNING token")));
        // The text form is the same statement with the values filled in.
        let text = mariadb.try_take("k", mode, None, false, HOLDER);
        assert_eq!(
            text.strip_prefix("BEGIN;").unwrap(),
            take.replacen('?', &literal("k"), 1)
                .replacen('?', &literal("w@h:1"), 1)
                .replacen('?', &literal("k"), 1)
        );
    }
    assert_eq!(mariadb.prepared_take(Mode::Permits(2)), None);
    let plain = Sql::new("t", Tokens::Sequence, Server::MariaDb);
    assert!(!plain.autocommit_off() && plain.prepared_take(X).is_none());
    let old = Sql::new("t", Tokens::Sequence, Server::MariaDb)
        .with_returning(false)
        .with_prepared_take();
    assert!(!old.autocommit_off() && old.prepared_take(X).is_none());
    let mysql = Sql::new("t", Tokens::Counter, Server::MySql).with_prepared_take();
    assert!(!mysql.autocommit_off());
    assert!(Sql::session_setup(false).contains("SET SESSION autocommit = 0;"));
    assert!(!Sql::session_setup(true).contains("autocommit"));
}
