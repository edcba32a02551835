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
