//! Settling a fenced grant's token before the lease is handed out. The granting nodes whose counter
//! is below the token have it raised, until enough of them carry it to share a node with every
//! later quorum (the scheme, and why it suffices: `fencing.rs`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;

use crate::error::Error;
use crate::lock::fencing::Fence;
use crate::lock::tally::{self, Skip};
use crate::lock::token::Token;
use crate::lock::Redlock;
use crate::node::ExtendRequest;

impl Redlock {
    /// Settles a fenced grant's token (see `fencing.rs`). It raises the counters of the nodes
    /// holding our lock that do not carry `fence.token` yet. The nodes holding our lock are
    /// `holding`: every vote for, also those that came after the decision. Their counters are in
    /// `fences`: the counted votes' counters, by node. It goes on until at least `N − quorum + 1`
    /// of them carry it, before `deadline`. The requests still in flight when that is reached
    /// finish in the background.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn settle_fence(
        &self,
        key: &Arc<str>,
        token: Token,
        ttl: Duration,
        fence: &Fence,
        fences: &[(usize, u64)],
        holding: u64,
        deadline: Instant,
    ) -> crate::Result<()> {
        let inner = &*self.inner;
        let need = inner.nodes.len() - inner.quorum + 1;
        let carry = fences
            .iter()
            .filter(|(_, f)| *f >= fence.token)
            .fold(0u64, |m, (i, _)| m | 1 << i);
        let mut have = carry.count_ones() as usize;
        if have >= need {
            return Ok(());
        }
        let below = holding & !carry;
        let floor = fence.floor();
        let mut sent = tally::send(
            &inner.nodes,
            below,
            inner.config.node_timeout,
            Skip::Suspended,
            &|node| node.extend_now(&ExtendRequest::new(key, token.as_str(), ttl).fenced(floor)),
            |v| {
                let (key, fence) = (key.clone(), fence.clone());
                async move {
                    let request = ExtendRequest::new(&key, token.as_str(), ttl);
                    v.node.extend(request.fenced(fence.floor())).await
                }
            },
        );
        let mut errors = Vec::new();
        while have < need {
            let next = tokio::time::timeout_at(deadline.into(), sent.next()).await;
            match next {
                Ok(Some((_, Ok(true)))) => have += 1,
                Ok(Some((_, Ok(false)))) => {}
                Ok(Some((_, Err(e)))) => errors.push(e),
                Ok(None) | Err(_) => break,
            }
        }
        tally::finish_in_background(sent);
        if have >= need && Instant::now() < deadline {
            return Ok(());
        }
        Err(Error::unavailable(
            format!(
                "the fencing token was settled on {have} of the {need} nodes it needs \
                 (the counters of the nodes that granted the lock, raised to the token) \
                 while the lock was valid"
            ),
            errors,
        ))
    }
}
