//! The constructors `RedlockLayer` (tower) and `RedlockMiddleware` (actix-web) share, written
//! once: both are a [`LockPolicy`](super::LockPolicy) with a framework's face.

/// `new`, `idempotent`, `with_policy`, `policy` and `From<LockPolicy>` for `$ty`, a struct
/// with one field `policy: LockPolicy`; `$what` names it in the docs ("layer",
/// "middleware").
macro_rules! policy_constructors {
    ($ty:ident, $what:literal) => {
        impl $ty {
            #[doc = concat!("A ", $what, " locking the key `extractor` derives, on `redlock`'s")]
            /// nodes, with the default [`LockPolicy`](crate::policy::LockPolicy).
            ///
            /// # Errors
            ///
            /// When the defaults do not fit `redlock` (e.g. its nodes' `restart_protection` is
            /// shorter than the default ttl of 30 s): a misconfiguration is reported here, never
            /// per request. Use [`LockPolicy::builder`](crate::policy::LockPolicy::builder) to
            /// choose a ttl that fits.
            pub fn new(
                redlock: $crate::Redlock,
                extractor: impl $crate::key::KeyExtractor,
            ) -> $crate::Result<Self> {
                let policy = $crate::policy::LockPolicy::builder(redlock, extractor).build()?;
                Ok(Self { policy })
            }

            /// An idempotent endpoint with the defaults: the `Idempotency-Key` header
            /// (required, scoped by route) locks the first request, whose response is stored
            /// and replayed to every later request with that key for 24 h (a reused key with
            /// another request: `422`). See
            /// [`LockPolicy::idempotent`](crate::policy::LockPolicy::idempotent) and
            /// [`replay`](crate::replay).
            ///
            /// # Errors
            ///
            /// As [`new`](Self::new).
            pub fn idempotent(redlock: $crate::Redlock) -> $crate::Result<Self> {
                let policy = $crate::policy::LockPolicy::idempotent(redlock).build()?;
                Ok(Self::with_policy(policy))
            }

            #[doc = concat!("A ", $what, " with a configured policy (checked when it was built).")]
            pub fn with_policy(policy: $crate::policy::LockPolicy) -> Self {
                Self { policy }
            }

            #[doc = concat!("The ", $what, "'s policy.")]
            pub fn policy(&self) -> &$crate::policy::LockPolicy {
                &self.policy
            }
        }

        impl From<$crate::policy::LockPolicy> for $ty {
            fn from(policy: $crate::policy::LockPolicy) -> Self {
                Self::with_policy(policy)
            }
        }
    };
}

pub(crate) use policy_constructors;
