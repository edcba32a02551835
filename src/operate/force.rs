//! An operator's act outside the lock's own verbs: the deletion of a stuck lock, of the
//! holder named by its token prefix, and of its completion record when asked
//! ([`Redlock::force_release`]). The crate never does it on its own.

use std::sync::Arc;

use super::inspect::TOKEN_PREFIX_LEN;
use crate::error::NodeError;
use crate::lock::{check_resource, record_key, Redlock};
use crate::node::{ForceReleaseRequest, Forced};

/// A forced release ([`Redlock::force_release`]): who asks, which holder it clears, and
/// whether the completion record goes too.
///
/// Name the holder by its token's prefix, as [`Redlock::inspect`] shows it
/// ([`Holder::token_prefix`](crate::operate::Holder::token_prefix)). A re-run after a voter did not
/// answer then deletes nothing of a holder that took the key meanwhile. It deletes a record only
/// with that holder's lock. Clearing whatever holds the key is a separate, explicit choice
/// ([`ForceRelease::any_holder`]). A forced release that makes neither choice is refused.
///
/// ```
/// use tower_redlock::operate::ForceRelease;
///
/// let precise = ForceRelease::by("alice").holder("2b5bcc88").with_record();
/// let blunt = ForceRelease::by("alice").any_holder();
/// # let _ = (precise, blunt);
/// ```
#[derive(Debug, Clone)]
#[must_use = "a forced release does nothing until given to `Redlock::force_release`"]
pub struct ForceRelease {
    by: String,
    record: bool,
    holder: Named,
}

/// Which holder a forced release clears.
#[derive(Debug, Clone)]
enum Named {
    /// Not said: refused.
    Unnamed,
    /// The holder whose token starts with this (checked when the release runs).
    Prefix(String),
    /// Whatever holds the key.
    Any,
}

/// The shortest holder prefix a forced release accepts: the prefix [`Redlock::inspect`]
/// shows, 32 random bits — two holders of one key share it once in four billion.
pub const MIN_HOLDER_PREFIX: usize = TOKEN_PREFIX_LEN;

impl ForceRelease {
    /// A forced release asked by `who` (an operator's name, a ticket): logged with it. Name
    /// the holder ([`holder`](Self::holder)) or choose [`any_holder`](Self::any_holder).
    pub fn by(who: impl Into<String>) -> Self {
        Self {
            by: who.into(),
            record: false,
            holder: Named::Unnamed,
        }
    }

    /// Clear only the holder whose token starts with `prefix`: the token prefix
    /// [`Redlock::inspect`] shows ([`MIN_HOLDER_PREFIX`] to 32 hex digits; anything else is
    /// refused as invalid input when the release runs, and nothing is deleted).
    pub fn holder(mut self, prefix: impl Into<String>) -> Self {
        self.holder = Named::Prefix(prefix.into());
        self
    }

    /// Clear whatever holds the key — also a holder that took it a moment ago. Prefer
    /// [`holder`](Self::holder): a re-run of this one can delete a new holder's lock (two
    /// holders at once) and, with [`with_record`](Self::with_record), its fresh record.
    pub fn any_holder(mut self) -> Self {
        self.holder = Named::Any;
        self
    }

    /// Delete the completion record too: the next request with this key runs the handler
    /// again instead of replaying. With a holder named, the record goes only on the voters
    /// where that holder's lock did.
    pub fn with_record(mut self) -> Self {
        self.record = true;
        self
    }

    /// Checks the choice of holder as [`Redlock::force_release`] does, before it runs (e.g.
    /// before asking an operator to confirm): an invalid-input error says what to fix.
    ///
    /// # Errors
    ///
    /// [`Error::is_invalid_input`](crate::Error::is_invalid_input): no holder named (and not
    /// [`any_holder`](Self::any_holder)), or a prefix shorter than [`MIN_HOLDER_PREFIX`].
    pub fn check(&self) -> crate::Result<()> {
        self.checked_holder().map(drop)
    }

    /// The holder's prefix, checked (`None`: any holder).
    fn checked_holder(&self) -> crate::Result<Option<String>> {
        match &self.holder {
            Named::Any => Ok(None),
            Named::Unnamed => Err(crate::Error::invalid(
                "a forced release must name the holder it clears: ForceRelease::holder(prefix) \
                 with the token prefix `inspect` shows (or, knowingly, any_holder())",
            )),
            Named::Prefix(p) => {
                let hex = p.bytes().all(|b| b.is_ascii_hexdigit());
                if !hex || p.len() < MIN_HOLDER_PREFIX || p.len() > 32 {
                    return Err(crate::Error::invalid(format!(
                        "a holder is named by {MIN_HOLDER_PREFIX} to 32 hex digits of its token \
                         (as `inspect` shows it); got {} characters{}",
                        p.len(),
                        if hex { "" } else { ", not all hex" }
                    )));
                }
                Ok(Some(p.to_ascii_lowercase()))
            }
        }
    }
}

/// What a forced release deleted on each voter.
#[derive(Debug)]
pub struct ForceReleased {
    voters: Vec<(usize, Arc<str>, Result<Forced, NodeError>)>,
}

impl ForceReleased {
    /// How many voters had a lock at the key, now deleted.
    pub fn locks_deleted(&self) -> usize {
        self.answers().filter(|f| f.lock).count()
    }

    /// How many voters had a completion record, now deleted (only when asked).
    pub fn records_deleted(&self) -> usize {
        self.answers().filter(|f| f.record).count()
    }

    /// Whether every voter answered: nothing is left at the key on any of them.
    pub fn is_complete(&self) -> bool {
        self.voters.iter().all(|(_, _, r)| r.is_ok())
    }

    /// The voters that did not answer (ask again once they are back).
    pub fn errors(&self) -> impl Iterator<Item = &NodeError> {
        self.voters.iter().filter_map(|(_, _, r)| r.as_ref().err())
    }

    /// Each voter's index, name, and what it deleted or why it did not answer.
    pub fn voters(&self) -> impl Iterator<Item = (usize, &str, Result<&Forced, &NodeError>)> {
        self.voters.iter().map(|(i, n, r)| (*i, &**n, r.as_ref()))
    }

    fn answers(&self) -> impl Iterator<Item = &Forced> {
        self.voters.iter().filter_map(|(_, _, r)| r.as_ref().ok())
    }
}

impl Redlock {
    /// Deletes the lock at `resource`'s key on every voter: the named holder's
    /// ([`ForceRelease::holder`], the token prefix [`Redlock::inspect`] shows), or whatever holds
    /// it ([`ForceRelease::any_holder`]). With [`ForceRelease::with_record`] it also deletes its
    /// completion record (with a holder named, only where its lock was deleted). The fencing
    /// counter is kept, so fencing tokens keep growing.
    ///
    /// An operator's act for a key a crashed holder left behind (or a record to forget); never done
    /// by the crate itself. It is logged at warn with the key's hash and who asked. **It breaks
    /// mutual exclusion if the holder is alive**: the next request takes the lock while the old
    /// holder still works. Fencing tokens, checked where the data lives, are what then refuses the
    /// old holder's writes. Every voter is asked in parallel, each bounded by five node timeouts,
    /// as [`Redlock::inspect`]. It is an operator's call, no vote: a busy machine must not make it
    /// fail, and a master whose script cache is empty answers it in two round trips. A voter that
    /// did not answer is in [`ForceReleased::errors`]. Run it again when the voter is back. With
    /// the holder named, the re-run deletes nothing of a holder that took the key meanwhile.
    ///
    /// A forced release that names no holder and did not choose
    /// [`any_holder`](ForceRelease::any_holder), or names one by anything but
    /// [`MIN_HOLDER_PREFIX`] to 32 hex digits, is refused as invalid input: nothing is sent.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use std::time::Duration;
    /// use tower_redlock::{operate::ForceRelease, Redlock};
    ///
    /// let redlock = Redlock::in_memory();
    /// std::mem::forget(redlock.try_lock("job", Duration::from_secs(60)).await.unwrap());
    /// let holder = redlock.inspect("job").await.unwrap().holder().unwrap();
    /// let how = ForceRelease::by("alice").holder(holder.token_prefix);
    /// let cleared = redlock.force_release("job", how.clone()).await.unwrap();
    /// assert_eq!(cleared.locks_deleted(), 1);
    ///
    /// // A new holder; the re-run spares it.
    /// let lease = redlock.try_lock("job", Duration::from_secs(5)).await.unwrap();
    /// assert_eq!(redlock.force_release("job", how).await.unwrap().locks_deleted(), 0);
    /// lease.release().await.unwrap();
    ///
    /// let unnamed = redlock.force_release("job", ForceRelease::by("alice")).await;
    /// assert!(unnamed.unwrap_err().is_invalid_input());
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::is_invalid_input`](crate::Error::is_invalid_input): an empty or too long
    /// resource, or a choice of holder [`ForceRelease::check`] refuses; nothing is deleted.
    /// A voter that does not answer is not an error: its entry in the answer says why.
    pub async fn force_release(
        &self,
        resource: &str,
        how: ForceRelease,
    ) -> crate::Result<ForceReleased> {
        check_resource(resource)?;
        let holder: Option<Arc<str>> = how.checked_holder()?.map(Into::into);
        let key: Arc<str> = self.redis_key(resource).into();
        let record = how.record.then(|| record_key(&key));
        tracing::warn!(
            key_hash = %self.key_hash(resource),
            by = %how.by,
            record = how.record,
            holder = holder.as_deref().unwrap_or("any"),
            "forced release of a lock (an operator's act)"
        );
        let answers = self
            .ask_every_voter(self.node_timeout().saturating_mul(5), |voter| {
                let (key, record, holder) = (key.clone(), record.clone(), holder.clone());
                async move {
                    let mut ask = ForceReleaseRequest::new(&key);
                    if let Some(record) = &record {
                        ask = ask.with_record(record);
                    }
                    if let Some(holder) = &holder {
                        ask = ask.holder(holder);
                    }
                    voter.node.force_release(ask).await
                }
            })
            .await;
        let voters = answers
            .into_iter()
            .map(|(i, answer)| (i, self.voters()[i].name.clone(), answer))
            .collect();
        Ok(ForceReleased { voters })
    }
}
