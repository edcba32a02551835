//! The constructor `RedlockLayer` (tower) and `RedlockMiddleware` (actix-web) share, written
//! once: both are a [`LockPolicy`](super::LockPolicy) with a framework's face.

/// `new` and `policy` for `$ty`, a struct with one field `policy: LockPolicy`; `$what` names
/// it in the docs ("layer", "middleware").
macro_rules! policy_constructors {
    ($ty:ident, $what:literal) => {
        impl $ty {
            #[doc = concat!("The ", $what, " of `policy` — built, and checked, by")]
            /// [`LockPolicy::builder`](crate::policy::LockPolicy::builder) (a key of your
            /// choice) or [`LockPolicy::idempotent`](crate::policy::LockPolicy::idempotent)
            /// (an idempotent endpoint: the `Idempotency-Key` header, replay): a
            /// misconfiguration is reported by the policy's `build`, never per request.
            #[doc(alias = "with_policy")]
            #[doc(alias = "idempotent")]
            pub fn new(policy: $crate::policy::LockPolicy) -> Self {
                Self { policy }
            }

            #[doc = concat!("The ", $what, "'s policy.")]
            pub fn policy(&self) -> &$crate::policy::LockPolicy {
                &self.policy
            }
        }
    };
}

pub(crate) use policy_constructors;
