//! The clock a runtime reads wall-clock time from and waits on: the system clock, or a
//! manual clock that a test moves forward.
//!
//! Every time the runtime records or compares (`at_ms`, sleep wake-ups, wait deadlines,
//! retry times, the age of a step record) and every wait for such a time (an in-place sleep,
//! a retry back-off, a parked run's timer, a step's or handler's time-out) goes through the
//! runtime's [`Clock`]. What stays on real time, whatever the clock: the lease deadline (a
//! monotonic `Instant`: a lease protects a run from other workers, who live in real time),
//! rate limits ([`Limit`](crate::Limit)), the back-off after a store fault, the polls of a
//! shared store, and the store's own notion of a ready run in `Store::claim_ready` (the
//! runtime's own timers wake the runs it parked, by its clock).

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::material::Material;

/// `duration` in whole milliseconds (sub-millisecond parts dropped), saturating at
/// `u64::MAX` ms (about 584 million years) for a longer duration such as [`Duration::MAX`].
///
/// Every conversion of a [`Duration`] to the milliseconds loops records or compares goes
/// through here, so that a duration too long for a `u64` of ms means "for ever" everywhere
/// and never wraps around to a short one.
pub fn duration_ms(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// `time` in milliseconds since the Unix epoch (rounded down): 0 for a time before the epoch,
/// `u64::MAX` for one more than `u64::MAX` ms after it.
pub fn epoch_ms(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH).map_or(0, duration_ms)
}

/// `ms` milliseconds since the Unix epoch as a `SystemTime`. Where the platform's
/// `SystemTime` cannot hold it (it is narrower than `u64` ms on some systems), the latest
/// of `u64::MAX` ms, 2^31 s (2038-01-19) and the epoch that it holds: never a panic.
pub(crate) fn system_time(ms: u64) -> SystemTime {
    UNIX_EPOCH
        .checked_add(Duration::from_millis(ms))
        .or_else(|| UNIX_EPOCH.checked_add(Duration::from_secs(i32::MAX.unsigned_abs().into())))
        .unwrap_or(UNIX_EPOCH)
}

/// The time `duration` after `at_ms` (both times in ms since the Unix epoch), saturating at
/// `u64::MAX` ms: a wake-up, deadline or retry time that far off is never reached. Every
/// addition of a [`Duration`] to a recorded time goes through here.
pub fn ms_after(at_ms: u64, duration: Duration) -> u64 {
    at_ms.saturating_add(duration_ms(duration))
}

/// Milliseconds since the Unix epoch, by the system clock (0 if the clock is before 1970).
/// Every wall-clock time loops records or compares (`at_ms`, wake-up and retry times) is
/// read here.
pub fn now_ms() -> u64 {
    let ms = epoch_ms(std::time::SystemTime::now());
    #[cfg(feature = "test-util")]
    let ms = ms.saturating_add_signed(CLOCK_OFFSET_MS.load(std::sync::atomic::Ordering::Relaxed));
    ms
}

/// The offset [`__set_clock_offset_ms`] gives [`now_ms`].
#[cfg(feature = "test-util")]
static CLOCK_OFFSET_MS: std::sync::atomic::AtomicI64 = std::sync::atomic::AtomicI64::new(0);

/// Moves this process's wall clock, as loops reads it ([`now_ms`]), by `offset_ms` (ms,
/// either way): for tests of a worker whose clock is off. Process-wide. Not a public API
/// (feature `test-util`).
#[cfg(feature = "test-util")]
#[doc(hidden)]
pub fn __set_clock_offset_ms(offset_ms: i64) {
    CLOCK_OFFSET_MS.store(offset_ms, std::sync::atomic::Ordering::Relaxed);
}

/// A random key nonce ([`RunInfo::key_nonce`](crate::RunInfo::key_nonce)): it must differ
/// between runs, not be unguessable (see loops-core's README for the generator).
pub(crate) fn random_key_nonce() -> u64 {
    fastrand::u64(..)
}

/// Where a runtime reads the time: the system clock (the default) or a [`ManualClock`].
/// Chosen with [`RuntimeBuilder::clock`](crate::RuntimeBuilder::clock). Cheap to clone.
#[derive(Clone, Debug, Default)]
pub struct Clock(Source);

#[derive(Clone, Debug, Default)]
enum Source {
    #[default]
    System,
    Manual(ManualClock),
}

impl Clock {
    /// The system clock: [`now_ms`](crate::now_ms), and tokio's timers for waits.
    pub fn system() -> Clock {
        Clock(Source::System)
    }

    /// Whether this is a [`ManualClock`].
    pub(crate) fn is_manual(&self) -> bool {
        matches!(self.0, Source::Manual(_))
    }

    /// The key nonce ([`RunInfo::key_nonce`](crate::RunInfo::key_nonce)) of run `run_id`
    /// created at `now_ms` by this clock: random by the system clock; by a [`ManualClock`],
    /// a hash of the run id, `now_ms` and how many runs of that id the clock (or a clone)
    /// saw created before, so that a test gets the same idempotency keys each time it runs
    /// (the crash explorer compares two runs without a crash, each on a clock of its own, and
    /// a run created after a crash on the restarted process's clock; a test may check a fake
    /// service's keys), and a run id used again under the same clock (after a prune, or in
    /// another store) gets keys of its own though the clock did not move. The manual clock
    /// is the seam a test controls the runtime's chance through, as its time.
    pub(crate) fn key_nonce(&self, run_id: &str, now_ms: u64) -> u64 {
        match &self.0 {
            Source::System => random_key_nonce(),
            Source::Manual(manual) => {
                let before = {
                    let mut created =
                        (manual.created.lock()).unwrap_or_else(PoisonError::into_inner);
                    let count = created.entry(run_id.to_owned()).or_insert(0);
                    *count += 1;
                    *count - 1
                };
                Material::with_capacity(24 + run_id.len())
                    .text(run_id)
                    .u64(now_ms)
                    .u64(before)
                    .hash64()
            }
        }
    }

    /// Milliseconds since the Unix epoch by this clock.
    pub fn now_ms(&self) -> u64 {
        match &self.0 {
            Source::System => now_ms(),
            Source::Manual(manual) => manual.now_ms(),
        }
    }

    /// [`now_ms`](Self::now_ms) as a `SystemTime`; where the platform's `SystemTime` cannot
    /// hold it (narrower than u64 ms), a time it holds (2^31 s, or the epoch): never a panic.
    pub fn now(&self) -> SystemTime {
        system_time(self.now_ms())
    }

    /// Waits until this clock reads `at_ms` (ms since the Unix epoch) or later; at once if
    /// it does already.
    pub(crate) async fn sleep_until_ms(&self, at_ms: u64) {
        match &self.0 {
            Source::System => {
                let ms = at_ms.saturating_sub(self.now_ms());
                if ms > 0 {
                    tokio::time::sleep(Duration::from_millis(ms)).await;
                }
            }
            Source::Manual(manual) => manual.reached(at_ms).await,
        }
    }

    /// Waits `duration` by this clock.
    pub(crate) async fn sleep(&self, duration: Duration) {
        match &self.0 {
            Source::System => tokio::time::sleep(duration).await,
            Source::Manual(manual) => manual.reached(manual.later(duration)).await,
        }
    }

    /// Runs `fut` for at most `limit` by this clock: `None` if the time ran out first.
    pub(crate) async fn timeout<F: Future>(&self, limit: Duration, fut: F) -> Option<F::Output> {
        tokio::select! {
            biased;
            out = fut => Some(out),
            () = self.sleep(limit) => None,
        }
    }
}

impl From<ManualClock> for Clock {
    fn from(manual: ManualClock) -> Clock {
        Clock(Source::Manual(manual))
    }
}

/// A wall clock that moves only when told ([`advance`](Self::advance), [`set`](Self::set)):
/// a runtime built with it ([`RuntimeBuilder::clock`](crate::RuntimeBuilder::clock)) sleeps,
/// waits for deadlines, backs off and times out by this clock, so that a test skips a day in
/// a call. Clones share one time. Millisecond resolution, as the records.
#[derive(Clone, Debug)]
pub struct ManualClock {
    now: Arc<tokio::sync::watch::Sender<u64>>,
    /// How many runs of each id runtimes on this clock created, for their key nonces
    /// ([`Clock::key_nonce`]).
    created: Arc<Mutex<HashMap<String, u64>>>,
}

impl ManualClock {
    /// A clock that reads `start` (rounded down to the millisecond; the Unix epoch if
    /// `start` is before it) until it is moved.
    pub fn new(start: SystemTime) -> ManualClock {
        let ms = epoch_ms(start);
        ManualClock {
            now: Arc::new(tokio::sync::watch::Sender::new(ms)),
            created: Arc::default(),
        }
    }

    /// A clock that starts at the system clock's present time.
    pub fn starting_now() -> ManualClock {
        ManualClock::new(SystemTime::now())
    }

    /// Milliseconds since the Unix epoch by this clock.
    pub fn now_ms(&self) -> u64 {
        *self.now.borrow()
    }

    /// [`now_ms`](Self::now_ms) as a `SystemTime`; where the platform's `SystemTime` cannot
    /// hold it (narrower than u64 ms), a time it holds (2^31 s, or the epoch): never a panic.
    pub fn now(&self) -> SystemTime {
        system_time(self.now_ms())
    }

    /// Moves the clock forward by `by` (whole milliseconds; saturates at `u64::MAX` ms) and
    /// wakes every wait whose time came.
    pub fn advance(&self, by: Duration) {
        self.now.send_modify(|now| *now = ms_after(*now, by));
    }

    /// Sets the clock to `to` if that is later than what it reads (a wall clock a test moves
    /// only forward), and wakes every wait whose time came; an earlier `to` changes nothing.
    pub fn set(&self, to: SystemTime) {
        let to = ManualClock::new(to).now_ms();
        self.now.send_if_modified(|now| {
            let later = to > *now;
            if later {
                *now = to;
            }
            later
        });
    }

    /// `duration` from now, in ms since the Unix epoch.
    fn later(&self, duration: Duration) -> u64 {
        ms_after(self.now_ms(), duration)
    }

    /// Waits until the clock reads `at_ms` or later.
    async fn reached(&self, at_ms: u64) {
        let mut rx = self.now.subscribe();
        // The sender lives as long as `self`: `wait_for` cannot fail while we hold it.
        let _ = rx.wait_for(|now| *now >= at_ms).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conversions_to_ms_saturate() {
        assert_eq!(duration_ms(Duration::from_micros(1_999)), 1);
        assert_eq!(duration_ms(Duration::from_millis(u64::MAX)), u64::MAX);
        assert_eq!(duration_ms(Duration::MAX), u64::MAX);
        assert_eq!(ms_after(1_000, Duration::from_millis(500)), 1_500);
        assert_eq!(ms_after(1_000, Duration::from_millis(u64::MAX)), u64::MAX);
        assert_eq!(ms_after(1_000, Duration::MAX), u64::MAX);
        assert_eq!(epoch_ms(UNIX_EPOCH + Duration::from_millis(1_234)), 1_234);
        assert_eq!(epoch_ms(UNIX_EPOCH - Duration::from_secs(1)), 0);
        let manual = ManualClock::new(UNIX_EPOCH + Duration::from_secs(1));
        manual.advance(Duration::MAX);
        assert_eq!(manual.now_ms(), u64::MAX);
        // Linux's SystemTime holds u64::MAX ms; a narrower one gives its latest time instead.
        assert_eq!(epoch_ms(manual.now()), u64::MAX);
        assert_eq!(epoch_ms(system_time(1_234)), 1_234);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_manual_sleep_ends_when_the_clock_is_advanced() {
        let manual = ManualClock::new(UNIX_EPOCH + Duration::from_secs(1_000));
        let clock = Clock::from(manual.clone());
        let sleeper = tokio::spawn({
            let clock = clock.clone();
            async move { clock.sleep(Duration::from_secs(86_400)).await }
        });
        tokio::task::yield_now().await;
        assert!(!sleeper.is_finished());
        manual.advance(Duration::from_secs(86_399));
        tokio::task::yield_now().await;
        assert!(!sleeper.is_finished());
        manual.advance(Duration::from_secs(1));
        sleeper.await.unwrap();
        assert_eq!(clock.now_ms(), 1_000_000 + 86_400_000);
        let timed = tokio::spawn({
            let clock = clock.clone();
            async move {
                clock
                    .timeout(Duration::from_secs(5), std::future::pending::<()>())
                    .await
            }
        });
        tokio::task::yield_now().await;
        manual.set(UNIX_EPOCH); // earlier: ignored
        manual.advance(Duration::from_secs(5));
        assert_eq!(timed.await.unwrap(), None);
    }
}
