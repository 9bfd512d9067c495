//! Where features meet (docs/design.md, "Where features meet"): the rules,
//! decided without I/O, and their orchestration, written once over the
//! [`crate::cluster::Cluster`] trait, so that `replay` and `serve` run the
//! same decisions and carry them out the same way.
//! - [`effect`]: the deferred effects (adopt, watch patch);
//! - [`verdict`]: what an effect does now, from the objects as they are;
//! - [`pass`]: what the periodic pass does, from the objects as they are;
//! - [`driver`] and [`resync`]: carrying both out against a cluster;
//!   [`source_change`]: a source's stored change, as a host's watch saw it;
//! - [`in_flight`]: the effects on their way; [`guard`]: the invariants on
//!   deleting a snapshot; [`observe`]: what the hosts are told.
//!
//! The hosts only schedule: replay's `simulator::scheduler`, serve's
//! `serve::queue`.

pub mod budget;
pub mod driver;
pub mod effect;
pub mod guard;
pub mod in_flight;
pub mod observe;
pub mod pass;
pub mod resync;
pub mod source_change;
pub mod verdict;
pub(crate) mod window_clock;

pub(crate) use budget::{parse_bytes, written_size, Budget, Limits};
pub use driver::{Driver, Ending, Next};
pub use effect::{Effect, PatchIntent};
pub use in_flight::{Begun, InFlight, Places, Room, Slot};
pub use observe::Silent;
pub(crate) use observe::{Observer, Reason};
pub(crate) use verdict::Hold;
pub use verdict::Rules;
