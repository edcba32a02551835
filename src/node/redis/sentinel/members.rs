//! The sentinels a voter asks, and how their answers are counted.
//!
//! A client's list of sentinels is a seed, not the group: sentinels are added later. A list of 3 of
//! a group of 5 would let 2 of those 3 — one side of a zone split — confirm a master the other 3
//! have failed over. So the voter asks every sentinel it knows of (those listed and those the group
//! names, `SENTINEL SENTINELS`). It counts each once (by its id, `SENTINEL MYID`, whatever address
//! it was reached by). It needs a majority of the **group**. The group is the largest of the
//! sentinels listed, the group each answer reports (`num-other-sentinels` + 1, and the peers it
//! names + 1) and the largest group seen so far.
//!
//! A sentinel never forgets a peer until `SENTINEL RESET`, so a removed sentinel still counts. That
//! is the safe side. The voter abstains when fewer than a majority of the group answer, and says
//! that a reset is how a removed sentinel leaves. The largest group seen shrinks only when a
//! majority of it answers reporting the smaller group (after the reset). A sentinel restarted
//! without its configuration, which knows no peer for a while, cannot shrink it.

use std::collections::HashSet;

use futures_util::stream::{FuturesUnordered, StreamExt};
use redis::aio::ConnectionManager;
use redis::Value;

use super::Sentinel;
use crate::node::redis::options::RedisNodeOptions;

/// The sentinels the voter asks: those listed, then those the group names.
pub(super) struct Members {
    members: Vec<Member>,
    /// How many sentinels the client lists (distinct addresses).
    listed: usize,
    /// The largest group seen so far (see the module's docs).
    largest: usize,
    /// Whether the client was told its list is shorter than the group.
    warned_short: bool,
}

struct Member {
    /// `host:port`, as listed or as the group names it.
    addr: String,
    conn: ConnectionManager,
    listed: bool,
}

impl Members {
    /// Connections (made lazily) to every sentinel `group` lists.
    pub(super) fn listed(group: &Sentinel, options: &RedisNodeOptions) -> crate::Result<Self> {
        let mut members: Vec<Member> = Vec::with_capacity(group.sentinels.len());
        for (host, port) in &group.sentinels {
            let addr = format!("{host}:{port}");
            if members.iter().any(|m| m.addr == addr) {
                continue;
            }
            let conn = connect(group, options, host, *port)
                .map_err(|e| crate::Error::invalid(format!("sentinel {addr}: {e}")))?;
            members.push(Member {
                addr,
                conn,
                listed: true,
            });
        }
        let listed = members.len();
        Ok(Self {
            members,
            listed,
            largest: listed,
            warned_short: false,
        })
    }

    /// Asks every known sentinel at once which master is current. Answers as soon as a majority of
    /// the group (as known so far, each answer's report included) agree on an address. Else, when
    /// all have answered or timed out, answers an error saying why, in words an operator can act
    /// on. Learns the sentinels the answers name, for the next time.
    pub(super) async fn ask(
        &mut self,
        group: &Sentinel,
        options: &RedisNodeOptions,
    ) -> Result<(String, u16), String> {
        let name = &group.master_name;
        let mut pipe = redis::pipe();
        pipe.cmd("SENTINEL")
            .arg("MYID")
            .cmd("SENTINEL")
            .arg("get-master-addr-by-name")
            .arg(name)
            .cmd("SENTINEL")
            .arg("MASTER")
            .arg(name)
            .cmd("SENTINEL")
            .arg("SENTINELS")
            .arg(name);
        let limit = options.connect_timeout;
        let mut tally = Tally::new(self.listed, self.largest);
        let mut asks: FuturesUnordered<_> = self
            .members
            .iter()
            .map(|m| {
                let mut conn = m.conn.clone();
                let pipe = &pipe;
                async move {
                    let reply =
                        tokio::time::timeout(limit, conn.send_packed_commands(pipe, 0, 4)).await;
                    let answer = match reply {
                        Err(_) => Err("no answer in time".to_owned()),
                        Ok(Err(e)) => Err(e.to_string()),
                        Ok(Ok(values)) => Answer::read(&values, name),
                    };
                    (m.addr.clone(), answer)
                }
            })
            .collect();
        let mut winner = None;
        while let Some((addr, answer)) = asks.next().await {
            if let Some(master) = tally.add(addr, answer) {
                winner = Some(master);
                break;
            }
        }
        let complete = winner.is_none();
        drop(asks);
        self.learn(group, options, &tally, complete);
        match winner {
            Some(master) => {
                if tally.group() > self.listed && !self.warned_short {
                    self.warned_short = true;
                    tracing::warn!(
                        voter = %group.name(),
                        listed = self.listed,
                        group = tally.group(),
                        "the client lists fewer sentinels than the group has: list every \
                         sentinel, once (the voter also asks those the group names, at the \
                         addresses they announce, and counts its majority over the whole group)"
                    );
                }
                Ok(master)
            }
            None => Err(tally.failure(name)),
        }
    }

    /// After a round: the largest group, and the sentinels the answers named that the voter
    /// does not ask yet. After a round every sentinel had its say in (one that found no
    /// majority: a round that found one ends early), a sentinel the answers no longer name
    /// (reset away) is asked no more, unless listed; one pruned by mistake (only a sentinel
    /// that lost its configuration answered) is learned again from the next full answer.
    fn learn(
        &mut self,
        group: &Sentinel,
        options: &RedisNodeOptions,
        tally: &Tally,
        complete: bool,
    ) {
        self.largest = tally.next_largest();
        if tally.answered() == 0 {
            return;
        }
        if complete {
            let named: HashSet<&str> = tally.peers().map(|(addr, _)| addr).collect();
            let answered: HashSet<&str> = tally.answered_addrs().collect();
            self.members.retain(|m| {
                m.listed || named.contains(m.addr.as_str()) || answered.contains(m.addr.as_str())
            });
        }
        for (addr, id) in tally.peers() {
            if self.members.iter().any(|m| m.addr == addr) || tally.has_id(id) {
                continue;
            }
            let Ok((host, port)) = super::host_port(addr, 26379) else {
                tracing::debug!(voter = %group.name(), sentinel = %addr, "not asked: no address");
                continue;
            };
            match connect(group, options, &host, port) {
                Ok(conn) => self.members.push(Member {
                    addr: addr.to_owned(),
                    conn,
                    listed: false,
                }),
                Err(e) => {
                    tracing::debug!(voter = %group.name(), sentinel = %addr, "not asked: {e}")
                }
            }
        }
    }
}

fn connect(
    group: &Sentinel,
    options: &RedisNodeOptions,
    host: &str,
    port: u16,
) -> redis::RedisResult<ConnectionManager> {
    let client = group.client(host, port, &group.sentinel_auth)?;
    ConnectionManager::new_lazy_with_config(client, options.manager_config())
}

/// One sentinel's answer: who it is, the master it names, the group it reports.
#[derive(Debug, Clone, PartialEq)]
struct Answer {
    /// `SENTINEL MYID`.
    id: String,
    /// `SENTINEL get-master-addr-by-name`.
    master: Result<(String, u16), String>,
    /// `num-other-sentinels` + 1 (`SENTINEL MASTER`).
    group: usize,
    /// `(host:port, id)` of each peer `SENTINEL SENTINELS` names.
    peers: Vec<(String, String)>,
}

impl Answer {
    /// The four replies of the pipeline. A sentinel that cannot say who it is or how large
    /// its group is gives no answer (its user needs `+sentinel|myid`, `+sentinel|master`
    /// and `+sentinel|sentinels` besides `+sentinel|get-master-addr-by-name`).
    fn read(values: &[Value], name: &str) -> Result<Self, String> {
        let [id, master, info, peers] = values else {
            return Err(format!("{} replies to a pipeline of 4", values.len()));
        };
        let refused = |what: &str, v: &Value| match v {
            Value::ServerError(e) => format!("{what}: {e:?}"),
            other => format!("{what}: unexpected answer {other:?}"),
        };
        let id = text(id).ok_or_else(|| refused("SENTINEL MYID", id))?;
        let master = match master {
            Value::Nil => Err(format!("does not know `{name}`")),
            v => parse_addr(v).ok_or_else(|| refused("SENTINEL get-master-addr-by-name", v)),
        };
        let group = fields(info)
            .and_then(|f| field(&f, "num-other-sentinels")?.parse::<usize>().ok())
            .ok_or_else(|| refused("SENTINEL MASTER", info))?
            + 1;
        let Value::Array(items) = peers else {
            return Err(refused("SENTINEL SENTINELS", peers));
        };
        let mut named = Vec::with_capacity(items.len());
        for item in items {
            let peer = fields(item).and_then(|f| {
                let (ip, port) = (field(&f, "ip")?, field(&f, "port")?);
                let addr = if ip.contains(':') {
                    format!("[{ip}]:{port}")
                } else {
                    format!("{ip}:{port}")
                };
                Some((addr, field(&f, "runid")?.to_owned()))
            });
            named.push(peer.ok_or_else(|| refused("SENTINEL SENTINELS", item))?);
        }
        Ok(Self {
            id,
            master,
            group,
            peers: named,
        })
    }
}

/// The answers of one round, counted.
struct Tally {
    listed: usize,
    largest: usize,
    /// Each sentinel's first answer, by id.
    answers: Vec<(String, Answer)>,
    errors: Vec<String>,
}

impl Tally {
    fn new(listed: usize, largest: usize) -> Self {
        Self {
            listed,
            largest,
            answers: Vec::new(),
            errors: Vec::new(),
        }
    }

    /// Counts one sentinel's answer; the master, once a majority of the group names it.
    fn add(&mut self, addr: String, answer: Result<Answer, String>) -> Option<(String, u16)> {
        match answer {
            Err(e) => self.errors.push(format!("sentinel {addr}: {e}")),
            // The same sentinel reached by a second address is counted once.
            Ok(a) if self.has_id(&a.id) => {}
            Ok(a) => {
                if let Err(e) = &a.master {
                    self.errors.push(format!("sentinel {addr}: {e}"));
                }
                self.answers.push((addr, a));
            }
        }
        let majority = self.group() / 2 + 1;
        self.votes()
            .into_iter()
            .find(|(_, n)| *n >= majority)
            .map(|(master, _)| master)
    }

    fn has_id(&self, id: &str) -> bool {
        self.answers.iter().any(|(_, a)| a.id == id)
    }

    /// How many sentinels answered (each once).
    fn answered(&self) -> usize {
        self.answers.len()
    }

    fn answered_addrs(&self) -> impl Iterator<Item = &str> {
        self.answers.iter().map(|(addr, _)| addr.as_str())
    }

    /// Every peer the answers name, `(host:port, id)`.
    fn peers(&self) -> impl Iterator<Item = (&str, &str)> {
        self.answers.iter().flat_map(|(_, a)| {
            a.peers
                .iter()
                .map(|(addr, id)| (addr.as_str(), id.as_str()))
        })
    }

    /// The group this round reports: the sentinels listed, and the largest group an answer
    /// reports (its count of peers, or the peers it names, and itself).
    fn reported(&self) -> usize {
        self.answers
            .iter()
            .map(|(_, a)| a.group.max(a.peers.len() + 1))
            .fold(self.listed, usize::max)
    }

    /// The largest group seen after this round: the round's report when larger, or when a
    /// majority of the largest group answered reporting a smaller one (sentinels reset).
    fn next_largest(&self) -> usize {
        let reported = self.reported();
        if reported >= self.largest || self.answered() > self.largest / 2 {
            reported
        } else {
            self.largest
        }
    }

    /// The group a majority is counted over this round.
    fn group(&self) -> usize {
        self.reported().max(self.largest)
    }

    /// The masters named, each with how many sentinels named it.
    fn votes(&self) -> Vec<((String, u16), usize)> {
        let mut votes: Vec<((String, u16), usize)> = Vec::new();
        for (_, a) in &self.answers {
            let Ok(master) = &a.master else { continue };
            match votes.iter_mut().find(|(m, _)| m == master) {
                Some((_, n)) => *n += 1,
                None => votes.push((master.clone(), 1)),
            }
        }
        votes
    }

    /// Why no master won, in words an operator can act on.
    fn failure(&self, name: &str) -> String {
        let (group, answered) = (self.group(), self.answered());
        let majority = group / 2 + 1;
        let named: Vec<String> = self
            .votes()
            .iter()
            .map(|((host, port), n)| format!("{host}:{port} by {n}"))
            .collect();
        let named = if named.is_empty() {
            "none".to_owned()
        } else {
            named.join(", ")
        };
        let errors = if self.errors.is_empty() {
            String::new()
        } else {
            format!("; {}", self.errors.join("; "))
        };
        if answered < majority {
            format!(
                "only {answered} of the {group} sentinels of `{name}` answered, fewer than a \
                 majority ({majority}): the others are unreachable (a split: reset nothing), \
                 or were removed from the group — a removed sentinel still counts until \
                 `SENTINEL RESET {name}` is sent to every remaining sentinel, and for a client \
                 that saw it until a majority of the group it saw answers or the client \
                 restarts (named: {named}{errors})"
            )
        } else {
            format!(
                "no majority ({majority} of {group}) of the sentinels of `{name}` named one \
                 master (named: {named}{errors})"
            )
        }
    }
}

/// A bulk or simple string as text.
fn text(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    }
}

/// A flat `[k1, v1, ...]` array (RESP2) or a map (RESP3) of strings.
fn fields(v: &Value) -> Option<Vec<(String, String)>> {
    match v {
        Value::Array(items) => items
            .chunks(2)
            .map(|kv| match kv {
                [k, v] => Some((text(k)?, text(v)?)),
                _ => None,
            })
            .collect(),
        Value::Map(pairs) => pairs
            .iter()
            .map(|(k, v)| Some((text(k)?, text(v)?)))
            .collect(),
        _ => None,
    }
}

fn field<'a>(fields: &'a [(String, String)], key: &str) -> Option<&'a str> {
    fields
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
}

/// `SENTINEL get-master-addr-by-name`'s `[host, port]`.
fn parse_addr(v: &Value) -> Option<(String, u16)> {
    let Value::Array(items) = v else { return None };
    match items.as_slice() {
        [host, port] => Some((text(host)?, text(port)?.parse().ok()?)),
        _ => None,
    }
}

#[cfg(test)]
mod tests;
