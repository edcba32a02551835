use super::*;

#[test]
fn the_statements_name_the_table_and_columns() {
    let t = FencedTable::new("ledger").unwrap();
    assert_eq!(
        t.claim_sql(),
        r#"UPDATE "ledger" SET "fence" = $2 WHERE "id" = $1 AND "fence" <= $2 RETURNING *"#
    );
    assert_eq!(
        t.claim_or_insert_sql(),
        r#"INSERT INTO "ledger" AS fenced_row ("id", "fence") VALUES ($1, $2) ON CONFLICT ("id") DO UPDATE SET "fence" = EXCLUDED."fence" WHERE fenced_row."fence" <= EXCLUDED."fence" RETURNING *"#
    );
    // Folded to lower case as PostgreSQL folds an unquoted name; a reserved word is quoted.
    let t = FencedTable::with_columns("App.Accounts", "user", "Token").unwrap();
    assert_eq!(
        t.claim_sql(),
        r#"UPDATE "app"."accounts" SET "token" = $2 WHERE "user" = $1 AND "token" <= $2 RETURNING *"#
    );
    assert_eq!(
        t.stored,
        r#"SELECT "token" FROM "app"."accounts" WHERE "user" = $1"#
    );
}

#[test]
fn names_that_are_not_plain_identifiers_are_refused() {
    let long = "t".repeat(64);
    for table in [
        "",
        ".",
        "a.",
        ".a",
        "a.b.c",
        "1ledger",
        "led ger",
        "ledger;drop table x",
        "\"Ledger\"",
        "lédger",
        &long,
    ] {
        let e = FencedTable::new(table).unwrap_err();
        assert_eq!(e, InvalidName::new("table", table));
        assert!(e.to_string().contains("not a plain SQL identifier"), "{e}");
    }
    assert!(FencedTable::new(&"t".repeat(63)).is_ok());
    assert!(FencedTable::new("_t1.Ledger_2").is_ok());
    let key = FencedTable::with_columns("t", "id--", "fence").unwrap_err();
    assert_eq!(key, InvalidName::new("key column", "id--"));
    let fence = FencedTable::with_columns("t", "id", "").unwrap_err();
    assert_eq!(fence, InvalidName::new("fence column", ""));
    assert!(!fence.to_string().contains("schema.table"), "{fence}");
}

#[test]
fn every_refusal_has_an_answer() {
    let stale = Refused::Stale(StaleToken::new(7, 9));
    let (ours, its) = (
        stale.to_problem_json(),
        StaleToken::new(7, 9).to_problem_json(),
    );
    assert_eq!((ours.status(), ours.body()), (its.status(), its.body()));
    assert_eq!(stale.to_string(), StaleToken::new(7, 9).to_string());
    for (refused, status) in [
        (Refused::Busy, 409),
        (Refused::Conflict, 409),
        (Refused::Missing, 404),
        (Refused::OutOfRange(u64::MAX), 500),
    ] {
        let answer = refused.to_problem_json();
        assert_eq!(answer.status(), status, "{refused}");
        let body: serde_json::Value = serde_json::from_slice(answer.body()).unwrap();
        assert_eq!(body["status"], status, "{refused}");
        if status == 409 {
            assert_eq!(body["type"], StaleToken::PROBLEM_TYPE);
        }
        assert!(!refused.to_string().is_empty());
    }
}
