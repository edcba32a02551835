use super::*;

#[test]
fn hashes_match_sources() {
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
            assert_eq!(
                redis::Script::new(s.source()).get_hash(),
                s.sha1(),
                "{}",
                &s.source()[..60]
            );
        }
    }
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
