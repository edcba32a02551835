use super::*;

fn bulk(s: &str) -> Value {
    Value::BulkString(s.as_bytes().to_vec())
}

fn flat(pairs: &[(&str, &str)]) -> Value {
    Value::Array(pairs.iter().flat_map(|(k, v)| [bulk(k), bulk(v)]).collect())
}

/// What a sentinel of a group of `group` answers, naming `master` (a port on 127.0.0.1).
fn answer(id: &str, master: u16, group: usize) -> Answer {
    Answer {
        id: id.to_owned(),
        master: Ok(("127.0.0.1".to_owned(), master)),
        group,
        peers: Vec::new(),
    }
}

fn master(port: u16) -> Option<(String, u16)> {
    Some(("127.0.0.1".to_owned(), port))
}

#[test]
fn reads_the_master_address() {
    let v = Value::Array(vec![bulk("127.0.0.1"), bulk("6380")]);
    assert_eq!(parse_addr(&v), master(6380));
    assert_eq!(parse_addr(&Value::Nil), None);
    assert_eq!(parse_addr(&Value::Array(vec![bulk("h")])), None);
}

#[test]
fn reads_a_whole_answer() {
    let values = [
        bulk("aaaa"),
        Value::Array(vec![bulk("127.0.0.1"), bulk("7000")]),
        flat(&[("name", "m"), ("num-other-sentinels", "4"), ("quorum", "3")]),
        Value::Array(vec![
            flat(&[("ip", "127.0.0.1"), ("port", "26380"), ("runid", "bbbb")]),
            flat(&[("ip", "10.0.0.2"), ("port", "26379"), ("runid", "cccc")]),
            flat(&[("ip", "::1"), ("port", "26381"), ("runid", "dddd")]),
        ]),
    ];
    let a = Answer::read(&values, "m").unwrap();
    assert_eq!(a.id, "aaaa");
    assert_eq!(a.master, Ok(("127.0.0.1".to_owned(), 7000)));
    assert_eq!(a.group, 5);
    assert_eq!(
        a.peers,
        [
            ("127.0.0.1:26380".to_owned(), "bbbb".to_owned()),
            ("10.0.0.2:26379".to_owned(), "cccc".to_owned()),
            ("[::1]:26381".to_owned(), "dddd".to_owned())
        ]
    );
}

#[test]
fn a_sentinel_that_cannot_say_its_group_gives_no_answer() {
    let noperm = redis::parse_redis_value(b"-NOPERM this user has no permissions\r\n").unwrap();
    assert!(matches!(noperm, Value::ServerError(_)), "{noperm:?}");
    let good = [
        bulk("aaaa"),
        Value::Array(vec![bulk("127.0.0.1"), bulk("7000")]),
        flat(&[("num-other-sentinels", "2")]),
        Value::Array(vec![]),
    ];
    for i in [0, 2, 3] {
        let mut values = good.clone();
        values[i] = noperm.clone();
        let e = Answer::read(&values, "m").unwrap_err();
        assert!(e.contains("SENTINEL"), "{e}");
    }
    // Not knowing the master is an answer (with no vote).
    let mut values = good.clone();
    values[1] = Value::Nil;
    let a = Answer::read(&values, "m").unwrap();
    assert!(a.master.unwrap_err().contains("does not know `m`"));
    assert!(Answer::read(&good[..3], "m").is_err());
}

#[test]
fn the_majority_is_over_the_group_not_the_list() {
    // Three listed of a group of five: two naming the old master are no majority.
    let mut t = Tally::new(3, 3);
    assert_eq!(t.add("s0".into(), Ok(answer("a", 7000, 5))), None);
    assert_eq!(t.add("s1".into(), Ok(answer("b", 7000, 5))), None);
    assert_eq!(t.add("s2".into(), Err("no answer in time".into())), None);
    assert_eq!(t.group(), 5);
    let why = t.failure("m");
    assert!(why.contains("only 2 of the 5"), "{why}");
    assert!(why.contains("a split: reset nothing"), "{why}");
    assert!(why.contains("SENTINEL RESET m"), "{why}");
    // The third that agrees makes it.
    assert_eq!(t.add("s3".into(), Ok(answer("c", 7000, 5))), master(7000));
}

#[test]
fn a_sentinel_reached_twice_is_counted_once() {
    let mut t = Tally::new(2, 3);
    assert_eq!(t.add("localhost:1".into(), Ok(answer("a", 7000, 3))), None);
    assert_eq!(t.add("127.0.0.1:1".into(), Ok(answer("a", 7000, 3))), None);
    assert_eq!(t.answered(), 1);
    assert_eq!(t.add("s2".into(), Ok(answer("b", 7000, 3))), master(7000));
}

#[test]
fn the_peers_named_count_even_when_the_count_is_lower() {
    let mut a = answer("a", 7000, 1);
    a.peers = vec![("h:1".into(), "b".into()), ("h:2".into(), "c".into())];
    let mut t = Tally::new(1, 1);
    // A group of three (two peers named): one is no majority.
    assert_eq!(t.add("s0".into(), Ok(a)), None);
    assert_eq!(t.group(), 3);
}

#[test]
fn the_largest_group_shrinks_only_by_a_majority_of_it() {
    // A sentinel that lost its configuration reports a group of one: no shrink.
    let mut t = Tally::new(1, 5);
    assert_eq!(t.add("s0".into(), Ok(answer("a", 7000, 1))), None);
    assert_eq!(t.next_largest(), 5);
    assert_eq!(t.group(), 5);
    // Two of five reporting three: no shrink either.
    let mut t = Tally::new(1, 5);
    t.add("s0".into(), Ok(answer("a", 7000, 3)));
    t.add("s1".into(), Ok(answer("b", 7000, 3)));
    assert_eq!(t.next_largest(), 5);
    // Three of five (a majority of it) reporting three after a reset: three it is.
    t.add("s2".into(), Ok(answer("c", 7000, 3)));
    assert_eq!(t.next_largest(), 3);
    // Growing needs no majority.
    let mut t = Tally::new(3, 3);
    t.add("s0".into(), Ok(answer("a", 7000, 5)));
    assert_eq!(t.next_largest(), 5);
}

#[test]
fn a_split_vote_names_what_each_side_said() {
    let mut t = Tally::new(5, 5);
    for (i, port) in [7000, 7000, 7001, 7001].into_iter().enumerate() {
        assert_eq!(
            t.add(format!("s{i}"), Ok(answer(&format!("id{i}"), port, 5))),
            None
        );
    }
    let why = t.failure("m");
    assert!(why.contains("no majority (3 of 5)"), "{why}");
    assert!(why.contains("127.0.0.1:7000 by 2"), "{why}");
    assert!(why.contains("127.0.0.1:7001 by 2"), "{why}");
}
