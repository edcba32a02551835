//! What a master's `INFO memory` says of eviction: its `maxmemory` and `maxmemory_policy`
//! (on a Cluster, every master's; the worst counts).

use redis::{RedisError, Value};

use crate::node::{CallError, Refusal};

/// The error code of a vote script's refusal on a master that may evict (the scripts'
/// `eviction_lua!`): `-EVICTS <policy> <maxmemory>`.
const SCRIPT_REFUSAL: &str = "EVICTS";

/// What a master's `INFO memory` says of eviction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Verdict {
    /// Every key stays until its ttl: `noeviction`, or no `maxmemory` (64-bit builds evict
    /// nothing then; a 32-bit build sets an implicit limit with `noeviction`).
    Keeps { policy: String },
    /// Keys may be evicted before their ttl; `master` names the Cluster master that does.
    Evicts {
        policy: String,
        maxmemory: u64,
        master: Option<String>,
    },
    /// `INFO memory` answered without the fields, or with an error (an ACL without `INFO`).
    Unknown(String),
}

impl Verdict {
    /// Whether `other` says what this one says: the same, or the same eviction where one of
    /// the two names no master (a script's refusal cannot name the Cluster master that
    /// refused; the background check can). A voter logs only a verdict that says something
    /// new, once per change.
    pub(super) fn says(&self, other: &Verdict) -> bool {
        match (self, other) {
            (
                Verdict::Evicts {
                    policy,
                    maxmemory,
                    master,
                },
                Verdict::Evicts {
                    policy: other_policy,
                    maxmemory: other_maxmemory,
                    master: other_master,
                },
            ) => {
                policy == other_policy
                    && maxmemory == other_maxmemory
                    && (master.is_none() || other_master.is_none() || master == other_master)
            }
            _ => self == other,
        }
    }
}

/// The verdict of an `INFO memory` reply: one master's text, or a Cluster's map of master
/// addresses to their texts (the worst of them counts).
pub(super) fn verdict(reply: &Value) -> Verdict {
    match reply {
        Value::BulkString(text) => of_text(&String::from_utf8_lossy(text)),
        Value::VerbatimString { text, .. } | Value::SimpleString(text) => of_text(text),
        Value::Map(masters) if !masters.is_empty() => {
            let mut worst: Option<Verdict> = None;
            for (addr, reply) in masters {
                let verdict = match verdict(reply) {
                    Verdict::Evicts {
                        policy, maxmemory, ..
                    } => Verdict::Evicts {
                        policy,
                        maxmemory,
                        master: Some(text_of(addr)),
                    },
                    other => other,
                };
                let rank = |v: &Verdict| match v {
                    Verdict::Keeps { .. } => 0,
                    Verdict::Unknown(_) => 1,
                    Verdict::Evicts { .. } => 2,
                };
                if worst.as_ref().is_none_or(|w| rank(&verdict) > rank(w)) {
                    worst = Some(verdict);
                }
            }
            worst.unwrap_or_else(|| Verdict::Unknown("no master answered".to_owned()))
        }
        Value::ServerError(e) => Verdict::Unknown(format!("INFO memory: {e:?}")),
        other => Verdict::Unknown(format!("unexpected reply to INFO memory: {other:?}")),
    }
}

/// The verdict a vote script's refusal carries (`-EVICTS <policy> <maxmemory>`), if `e` is
/// one: the master evicts, as read inside the script.
pub(super) fn of_refusal(e: &RedisError) -> Option<Verdict> {
    if e.code() != Some(SCRIPT_REFUSAL) {
        return None;
    }
    let mut words = e.detail()?.split_whitespace();
    let policy = words.next()?.to_owned();
    let maxmemory = words.next()?.parse().ok()?;
    Some(Verdict::Evicts {
        policy,
        maxmemory,
        master: None,
    })
}

fn text_of(v: &Value) -> String {
    match v {
        Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        Value::SimpleString(s) | Value::VerbatimString { text: s, .. } => s.clone(),
        other => format!("{other:?}"),
    }
}

/// The verdict of one master's `INFO memory` text.
fn of_text(info: &str) -> Verdict {
    let field = |name: &str| {
        info.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .map(str::trim)
    };
    let (Some(maxmemory), Some(policy)) = (
        field("maxmemory").and_then(|m| m.parse::<u64>().ok()),
        field("maxmemory_policy"),
    ) else {
        return Verdict::Unknown("INFO memory has no maxmemory or maxmemory_policy".to_owned());
    };
    let policy = policy.to_owned();
    if maxmemory == 0 || policy == "noeviction" {
        Verdict::Keeps { policy }
    } else {
        // Any other policy — allkeys-*, volatile-* (a lock has a ttl), or one unknown
        // today — may evict.
        Verdict::Evicts {
            policy,
            maxmemory,
            master: None,
        }
    }
}

/// Why a voter abstains for a master that evicts keys under `policy` past `maxmemory`
/// bytes (`master` names it on a Cluster): unmarked, refused unsent or by the script.
pub(super) fn abstains(policy: &str, maxmemory: u64, master: Option<&str>) -> CallError {
    CallError::new(format!(
        "the master{} may evict keys (maxmemory-policy {policy}, maxmemory {maxmemory} \
         bytes): a lock or a completion record could vanish before its ttl, so this voter \
         abstains. Set `maxmemory-policy noeviction` on it (a Redis not shared with a cache), \
         or accept the risk with RedisNodeOptions::allow_eviction()",
        master.map(|m| format!(" {m}")).unwrap_or_default(),
    ))
}

/// The error of a vote script that refused on a master that may evict (`-EVICTS`), as the
/// voter's abstention — not a local one: the master answered, it is there; `None` for any
/// other error.
pub(crate) fn refusal(e: &RedisError) -> Option<CallError> {
    match of_refusal(e)? {
        Verdict::Evicts {
            policy, maxmemory, ..
        } => Some(abstains(&policy, maxmemory, None).with_refusal(Refusal::Abstained)),
        Verdict::Keeps { .. } | Verdict::Unknown(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(maxmemory: u64, policy: &str) -> String {
        format!(
            "# Memory\r\nused_memory:914752\r\nmaxmemory:{maxmemory}\r\n\
             maxmemory_human:0B\r\nmaxmemory_policy:{policy}\r\nmem_fragmentation_ratio:9.1\r\n"
        )
    }

    fn bulk(text: &str) -> Value {
        Value::BulkString(text.as_bytes().to_vec())
    }

    #[test]
    fn reads_the_policy_and_the_limit() {
        let keeps = |p: &str| Verdict::Keeps {
            policy: p.to_owned(),
        };
        assert_eq!(verdict(&bulk(&info(0, "noeviction"))), keeps("noeviction"));
        assert_eq!(
            verdict(&bulk(&info(1 << 20, "noeviction"))),
            keeps("noeviction")
        );
        // No limit: nothing is evicted, whatever the policy (64-bit builds).
        assert_eq!(
            verdict(&bulk(&info(0, "allkeys-lru"))),
            keeps("allkeys-lru")
        );
        for policy in [
            "allkeys-lru",
            "allkeys-lfu",
            "allkeys-random",
            "volatile-lru",
            "volatile-lfu",
            "volatile-random",
            "volatile-ttl",
            "a-policy-of-tomorrow",
        ] {
            assert_eq!(
                verdict(&bulk(&info(1 << 20, policy))),
                Verdict::Evicts {
                    policy: policy.to_owned(),
                    maxmemory: 1 << 20,
                    master: None
                },
                "{policy}"
            );
        }
        // RESP3's verbatim string.
        let verbatim = Value::VerbatimString {
            format: redis::VerbatimFormat::Text,
            text: info(5, "volatile-ttl"),
        };
        assert!(matches!(verdict(&verbatim), Verdict::Evicts { .. }));
        // `maxmemory` is not `maxmemory_human` nor `maxmemory_policy`.
        assert!(matches!(
            verdict(&bulk(
                "maxmemory_policy:allkeys-lru\r\nmaxmemory_human:1M\r\n"
            )),
            Verdict::Unknown(_)
        ));
        assert!(matches!(verdict(&Value::Nil), Verdict::Unknown(_)));
    }

    #[test]
    fn reads_a_scripts_refusal() {
        let refusal = |detail: &str| {
            redis::make_extension_error(SCRIPT_REFUSAL.to_owned(), Some(detail.to_owned()))
        };
        assert_eq!(
            of_refusal(&refusal("allkeys-lru 1048576")),
            Some(Verdict::Evicts {
                policy: "allkeys-lru".to_owned(),
                maxmemory: 1 << 20,
                master: None
            })
        );
        // Anything else is no refusal of ours.
        assert_eq!(of_refusal(&refusal("allkeys-lru")), None);
        let other = redis::make_extension_error("OTHER".to_owned(), Some("x 1".to_owned()));
        assert_eq!(of_refusal(&other), None);
    }

    #[test]
    fn a_cluster_counts_its_worst_master() {
        let map = |entries: Vec<(&str, Value)>| {
            Value::Map(entries.into_iter().map(|(a, v)| (bulk(a), v)).collect())
        };
        let all_keep = map(vec![
            ("10.0.0.1:7000", bulk(&info(0, "noeviction"))),
            ("10.0.0.2:7000", bulk(&info(0, "noeviction"))),
        ]);
        assert!(matches!(verdict(&all_keep), Verdict::Keeps { .. }));
        let one_evicts = map(vec![
            ("10.0.0.1:7000", bulk(&info(0, "noeviction"))),
            ("10.0.0.2:7000", bulk(&info(100, "allkeys-lfu"))),
            ("10.0.0.3:7000", bulk("no fields")),
        ]);
        assert_eq!(
            verdict(&one_evicts),
            Verdict::Evicts {
                policy: "allkeys-lfu".to_owned(),
                maxmemory: 100,
                master: Some("10.0.0.2:7000".to_owned()),
            }
        );
        let one_unknown = map(vec![
            ("10.0.0.1:7000", bulk(&info(0, "noeviction"))),
            ("10.0.0.3:7000", bulk("no fields")),
        ]);
        assert!(matches!(verdict(&one_unknown), Verdict::Unknown(_)));
    }

    /// A Cluster voter's refusal (no master named) says what its check (naming the master)
    /// said, and the other way round: one warning per change, not two.
    #[test]
    fn a_refusal_says_what_the_check_said() {
        let evicts = |policy: &str, master: Option<&str>| Verdict::Evicts {
            policy: policy.to_owned(),
            maxmemory: 1 << 20,
            master: master.map(str::to_owned),
        };
        let checked = evicts("allkeys-lru", Some("127.0.0.1:7001"));
        let refused = evicts("allkeys-lru", None);
        assert!(checked.says(&refused) && refused.says(&checked));
        assert!(!checked.says(&evicts("allkeys-lru", Some("127.0.0.1:7002"))));
        assert!(!refused.says(&evicts("volatile-lru", None)));
        let keeps = Verdict::Keeps {
            policy: "noeviction".to_owned(),
        };
        assert!(!refused.says(&keeps) && keeps.says(&keeps.clone()));
    }
}
