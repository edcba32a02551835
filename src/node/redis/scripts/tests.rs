use super::*;

#[test]
fn hashes_match_sources() {
    let mut wrong = Vec::new();
    for s in [
        &ACQUIRE,
        &ACQUIRE_GUARDED,
        &RELEASE,
        &EXTEND,
        &ACQUIRE_UNLESS_COMPLETED,
        &COMPLETE,
        &ACQUIRE_FENCED,
        &ACQUIRE_UNLESS_COMPLETED_FENCED,
        &RELEASE_FENCED,
        &COMPLETE_FENCED,
        &EXTEND_FENCED,
        &COMPLETE_FREE,
        &COMPLETE_FREE_FENCED,
        &FORCE_RELEASE,
    ] {
        for s in std::iter::once(s).chain(s.lenient()) {
            let hash = redis::Script::new(s.source()).get_hash().to_owned();
            if hash != s.sha1() {
                wrong.push(format!("{} is {hash}", s.sha1()));
            }
        }
    }
    // Every wrong hash at once, with the right one: a script change moves several.
    assert!(wrong.is_empty(), "stale hashes:\n{}", wrong.join("\n"));
}

/// Every script that votes — acquires, extensions and completions — starts with the
/// eviction check, and its lenient variant is the same script without it; the scripts that
/// do not vote (releases) have neither.
#[test]
fn every_vote_script_checks_eviction() {
    for s in [
        &ACQUIRE,
        &ACQUIRE_GUARDED,
        &EXTEND,
        &ACQUIRE_UNLESS_COMPLETED,
        &COMPLETE,
        &ACQUIRE_FENCED,
        &ACQUIRE_UNLESS_COMPLETED_FENCED,
        &COMPLETE_FENCED,
        &EXTEND_FENCED,
        &COMPLETE_FREE,
        &COMPLETE_FREE_FENCED,
    ] {
        assert!(s.votes(), "{}", &s.source()[..60]);
        assert!(s.source().starts_with(eviction_lua!()), "{}", s.sha1());
        let lenient = s.lenient().expect("a lenient variant");
        assert_eq!(
            format!("{}{}", eviction_lua!(), lenient.source()),
            s.source()
        );
        assert!(!lenient.source().contains("EVICTS"), "{}", lenient.sha1());
    }
    for s in [&RELEASE, &RELEASE_FENCED, &FORCE_RELEASE] {
        assert!(!s.votes() && s.lenient().is_none(), "{}", s.sha1());
        assert!(!s.source().contains("EVICTS"), "{}", s.sha1());
    }
}
