//! Schedules: when a schedule's ticks fall ([`Schedule`]: a cron pattern in a time zone, or a
//! fixed interval), what a restart does with the ticks it missed ([`CatchUp`]), the stored
//! row of a schedule ([`ScheduleInfo`]) and the run id of a tick ([`tick_run_id`]), the one
//! function that makes a tick fire at most once.
//!
//! The runtime's part (the loop that fires ticks, `Runtime::schedule`) is in
//! `runtime/schedules.rs`; what the schedule writes mean is `store/schedule_plan.rs`.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use chrono::{DateTime, SecondsFormat, TimeZone, Utc};
use serde::{Deserialize, Serialize};

/// Longest schedule name, in bytes.
pub const MAX_SCHEDULE_NAME_BYTES: usize = 128;

/// The most missed ticks [`CatchUp::All`] runs at once, at a catch-up or in a loop that woke
/// late: the latest ones; older missed ticks are skipped (with a warning in the log).
pub const MAX_CATCH_UP: usize = 100;

/// The attribute every run a schedule starts carries: its key, with the schedule's name as
/// a string value (`loops runs --attr loops.schedule=NAME`).
pub const SCHEDULE_ATTRIBUTE: &str = "loops.schedule";

/// When a schedule's ticks fall, and what a restart does with the ticks it missed.
///
/// ```
/// # extern crate loops_core as loops;
/// use std::time::Duration;
/// use loops::{CatchUp, Schedule};
/// let hourly = Schedule::every(Duration::from_secs(3600)).unwrap();
/// let weekdays = Schedule::cron_in("0 9 * * MON-FRI", "Europe/Paris")
///     .unwrap()
///     .catch_up(CatchUp::Latest);
/// assert_eq!(weekdays.to_string(), "cron 0 9 * * MON-FRI Europe/Paris");
/// # let _ = hourly;
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Schedule {
    spec: Spec,
    catch_up: CatchUp,
}

/// The tick times of a [`Schedule`].
#[derive(Debug, Clone, PartialEq)]
enum Spec {
    /// A cron pattern (as given) in a time zone.
    Cron {
        pattern: String,
        cron: Box<croner::Cron>,
        zone: chrono_tz::Tz,
    },
    /// Every `ms` milliseconds, counted from the Unix epoch.
    Every { ms: u64 },
}

/// What a schedule does with the ticks that fell while no process ran its loop (the
/// process was down, or late), computed from its stored last tick when it is registered
/// again, and when its loop wakes late.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CatchUp {
    /// Missed ticks are not run: the schedule goes on with its next tick. (A loop that wakes
    /// late runs the latest tick that fell, as it is the one it woke for.)
    #[default]
    Skip,
    /// The latest missed tick runs, once; older missed ticks are skipped.
    Latest,
    /// Every missed tick runs, oldest first, at most the latest [`MAX_CATCH_UP`].
    All,
}

impl CatchUp {
    /// The policy's name as stored and printed: `skip`, `latest` or `all`.
    pub fn as_str(self) -> &'static str {
        match self {
            CatchUp::Skip => "skip",
            CatchUp::Latest => "latest",
            CatchUp::All => "all",
        }
    }
}

impl fmt::Display for CatchUp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Schedule {
    /// A tick every `interval`, at the multiples of `interval` since the Unix epoch (UTC):
    /// `every(1 h)` ticks at every full hour, whenever the process started, so that every
    /// worker and every restart computes the same ticks. Catch-up [`CatchUp::Skip`].
    ///
    /// # Errors
    /// [`InvalidSchedule`] if `interval` is under one millisecond or over `u64::MAX` ms.
    pub fn every(interval: Duration) -> Result<Schedule, InvalidSchedule> {
        let ms = u64::try_from(interval.as_millis())
            .map_err(|_| InvalidSchedule::new("the interval is over u64::MAX ms"))?;
        if ms == 0 {
            return Err(InvalidSchedule::new("the interval is under 1 ms"));
        }
        Ok(Schedule {
            spec: Spec::Every { ms },
            catch_up: CatchUp::default(),
        })
    }

    /// A tick at each time that the cron `pattern` matches in UTC. The pattern has 5 fields
    /// (minute, hour, day of month, month, day of week), 6 (seconds first) or 7 (seconds
    /// first, year last), with the extensions of the `croner` crate (`L`, `W`, `#`,
    /// `@hourly`, ...). A pattern that never matches (`0 0 31 2 *`) is refused here, and one
    /// whose times are all past (`0 0 1 1 * 2020`) by [`Runtime::schedule`](crate::Runtime::schedule).
    /// Catch-up [`CatchUp::Skip`].
    ///
    /// # Errors
    /// [`InvalidSchedule`] with the parser's reason.
    pub fn cron(pattern: &str) -> Result<Schedule, InvalidSchedule> {
        Schedule::cron_in(pattern, "UTC")
    }

    /// As [`cron`](Self::cron), the pattern read in the IANA time zone `zone`
    /// (`"Europe/Paris"`): `0 9 * * *` is 9:00 there, on both sides of a daylight saving
    /// change. A fixed time that a spring-forward change skips ticks at the first time after
    /// the gap; one that a fall-back change repeats ticks once, at its first occurrence
    /// (croner's rules).
    ///
    /// # Errors
    /// [`InvalidSchedule`] for a pattern the parser refuses, one that never matches, or a
    /// zone it does not know.
    pub fn cron_in(pattern: &str, zone: &str) -> Result<Schedule, InvalidSchedule> {
        let pattern = pattern.split_whitespace().collect::<Vec<_>>().join(" ");
        let never = format!("cron pattern `{pattern}` never matches a time");
        let cron = croner::Cron::from_str(&pattern)
            .map_err(|e| InvalidSchedule(format!("cron pattern `{pattern}`: {e}")))?;
        let zone = chrono_tz::Tz::from_str(zone)
            .map_err(|_| InvalidSchedule(format!("unknown time zone `{zone}`")))?;
        let schedule = Schedule {
            spec: Spec::Cron {
                pattern,
                cron: Box::new(cron),
                zone,
            },
            catch_up: CatchUp::default(),
        };
        // Every tick of a pattern comes within some years of any time (a leap day's, within
        // 8): one that finds none after the Unix epoch never ticks.
        if schedule.next_after(0).is_none() {
            return Err(InvalidSchedule(never));
        }
        Ok(schedule)
    }

    /// The same schedule with catch-up policy `policy`.
    pub fn catch_up(mut self, policy: CatchUp) -> Schedule {
        self.catch_up = policy;
        self
    }

    /// Its catch-up policy.
    pub fn catch_up_policy(&self) -> CatchUp {
        self.catch_up
    }

    /// The first tick strictly after `after_ms` (ms since the Unix epoch); `None` if there is
    /// none before the year 9999 or `u64::MAX` ms.
    pub fn next_after(&self, after_ms: u64) -> Option<u64> {
        match &self.spec {
            Spec::Every { ms } => (after_ms / ms).checked_add(1)?.checked_mul(*ms),
            Spec::Cron { cron, zone, .. } => {
                // Cron ticks fall on whole seconds: from the second `after_ms` is in.
                let at = to_zoned(after_ms / 1000 * 1000, zone)?;
                let next = cron.find_next_occurrence(&at, false).ok()?;
                from_zoned(&next)
            }
        }
    }

    /// The last tick at or before `at_ms`, if there is one after the Unix epoch.
    pub fn last_at_or_before(&self, at_ms: u64) -> Option<u64> {
        match &self.spec {
            Spec::Every { ms } => Some(at_ms / ms * ms).filter(|t| *t > 0),
            Spec::Cron { cron, zone, .. } => {
                // Cron ticks fall on whole seconds (croner matches a time by its second, and
                // would answer `at_ms` itself, with its milliseconds).
                let at = to_zoned(at_ms / 1000 * 1000, zone)?;
                let last = cron.find_previous_occurrence(&at, true).ok()?;
                from_zoned(&last)
            }
        }
    }

    /// The ticks in `(after_ms, upto_ms]`, oldest first: at most the latest `max` of them.
    pub fn ticks_between(&self, after_ms: u64, upto_ms: u64, max: usize) -> Vec<u64> {
        let mut out = Vec::new();
        let mut at = upto_ms;
        while out.len() < max {
            match self.last_at_or_before(at) {
                Some(t) if t > after_ms => {
                    out.push(t);
                    match t.checked_sub(1) {
                        Some(before) => at = before,
                        None => break,
                    }
                }
                _ => break,
            }
        }
        out.reverse();
        out
    }
}

/// `ms` since the Unix epoch as a time in `zone`.
fn to_zoned(ms: u64, zone: &chrono_tz::Tz) -> Option<DateTime<chrono_tz::Tz>> {
    let ms = i64::try_from(ms).ok()?;
    Some(Utc.timestamp_millis_opt(ms).single()?.with_timezone(zone))
}

/// A time as ms since the Unix epoch, to the whole second (`None` before the epoch).
fn from_zoned<Z: TimeZone>(at: &DateTime<Z>) -> Option<u64> {
    u64::try_from(at.timestamp()).ok()?.checked_mul(1000)
}

/// As stored and printed: `every {ms}ms`, or `cron {pattern} {zone}`; read back by
/// [`FromStr`].
impl fmt::Display for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.spec {
            Spec::Every { ms } => write!(f, "every {ms}ms"),
            Spec::Cron { pattern, zone, .. } => write!(f, "cron {pattern} {}", zone.name()),
        }
    }
}

/// Reads what [`Display`](fmt::Display) writes (the catch-up policy is not part of it:
/// [`CatchUp::Skip`]).
impl FromStr for Schedule {
    type Err = InvalidSchedule;

    fn from_str(s: &str) -> Result<Schedule, InvalidSchedule> {
        if let Some(ms) = s.strip_prefix("every ").and_then(|r| r.strip_suffix("ms")) {
            let ms: u64 = ms
                .trim()
                .parse()
                .map_err(|_| InvalidSchedule(format!("`{s}`: not a number of ms")))?;
            return Schedule::every(Duration::from_millis(ms));
        }
        if let Some(rest) = s.strip_prefix("cron ") {
            let (pattern, zone) = rest
                .trim()
                .rsplit_once(' ')
                .ok_or_else(|| InvalidSchedule(format!("`{s}`: no time zone after the pattern")))?;
            return Schedule::cron_in(pattern, zone);
        }
        Err(InvalidSchedule(format!(
            "`{s}`: neither `every {{ms}}ms` nor `cron {{pattern}} {{zone}}`"
        )))
    }
}

/// A schedule that cannot be built: an interval under 1 ms, a cron pattern the parser
/// refuses, an unknown time zone, or a stored spec that does not read back. The string says
/// which.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct InvalidSchedule(pub String);

impl InvalidSchedule {
    fn new(reason: &str) -> InvalidSchedule {
        InvalidSchedule(reason.to_owned())
    }
}

/// One tick of a schedule: what the closure given to `Runtime::schedule` is handed to build
/// the tick's initial state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tick {
    /// The schedule's name.
    pub schedule: String,
    /// The tick's time (when it was due, not when it fired), ms since the Unix epoch.
    pub at_ms: u64,
    /// The run id it starts ([`tick_run_id`]).
    pub run_id: String,
}

/// The run id of the tick at `tick_ms` (ms since the Unix epoch) of schedule `name`:
/// `{name}@{RFC 3339 UTC time, in ms}`, e.g. `nightly@2026-12-02T03:00:00.000Z`. The one place
/// a tick becomes an id: a run's creation is refused when its id exists, so a tick fires at
/// most once, whichever process or restart fires it.
pub fn tick_run_id(name: &str, tick_ms: u64) -> String {
    let at = i64::try_from(tick_ms)
        .ok()
        .and_then(|ms| Utc.timestamp_millis_opt(ms).single());
    match at {
        Some(at) => format!("{name}@{}", at.to_rfc3339_opts(SecondsFormat::Millis, true)),
        // Past chrono's range (year 262143): the number itself, still one id per tick.
        None => format!("{name}@{tick_ms}"),
    }
}

/// Checks a schedule name: 1 to [`MAX_SCHEDULE_NAME_BYTES`] bytes of ASCII letters, digits,
/// `_`, `-` and `.`, starting with a letter or a digit (so that a tick's run id,
/// `{name}@{time}`, reads back unambiguously, and a name is never read as a path or an
/// option on a command line).
///
/// # Errors
/// The rule broken.
pub fn check_schedule_name(name: &str) -> Result<(), &'static str> {
    if name.is_empty() {
        Err("empty")
    } else if name.len() > MAX_SCHEDULE_NAME_BYTES {
        Err("longer than 128 bytes")
    } else if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
    {
        Err("not only ASCII letters, digits, `_`, `-` and `.`")
    } else if !name.starts_with(|c: char| c.is_ascii_alphanumeric()) {
        // `.`, `..` and `-x` read as paths or options on a command line.
        Err("does not start with an ASCII letter or digit")
    } else {
        Ok(())
    }
}

/// A schedule as stored: one row per name, in both stores (JSON, like a run's row).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ScheduleInfo {
    /// Its name (the row's key).
    #[serde(skip)]
    pub name: String,
    /// The workflow whose runs its ticks start.
    pub workflow: String,
    /// When it ticks, as [`Schedule`]'s `Display` writes it (`every 60000ms`,
    /// `cron 0 9 * * * Europe/Paris`).
    pub spec: String,
    /// What a restart does with missed ticks.
    pub catch_up: CatchUp,
    /// Whether it is paused: its ticks start nothing (and are not caught up on resume).
    pub paused: bool,
    /// Every tick at or before this time (ms since the Unix epoch) is settled: it fired, or
    /// fell before the schedule was first registered, or while it was paused (a resume
    /// moves this to the resume's time). Catch-up looks at the ticks after it.
    pub through_ms: u64,
    /// The latest tick that started a run, if any (ms since the Unix epoch).
    pub last_tick_ms: Option<u64>,
    /// When it was first registered (ms since the Unix epoch).
    pub created_ms: u64,
    /// When it last changed.
    pub updated_ms: u64,
}

impl ScheduleInfo {
    /// A new schedule's row: not paused, nothing fired, ticks counted from `at_ms`.
    pub fn new(name: &str, workflow: &str, schedule: &Schedule, at_ms: u64) -> ScheduleInfo {
        ScheduleInfo {
            name: name.to_owned(),
            workflow: workflow.to_owned(),
            spec: schedule.to_string(),
            catch_up: schedule.catch_up_policy(),
            paused: false,
            through_ms: at_ms,
            last_tick_ms: None,
            created_ms: at_ms,
            updated_ms: at_ms,
        }
    }

    /// Its [`Schedule`], read back from [`spec`](Self::spec) with its catch-up policy.
    ///
    /// # Errors
    /// [`InvalidSchedule`] if the stored spec does not read back (written by another build).
    pub fn schedule(&self) -> Result<Schedule, InvalidSchedule> {
        Ok(Schedule::from_str(&self.spec)?.catch_up(self.catch_up))
    }

    /// Its next tick after `now_ms` (and after [`through_ms`](Self::through_ms)), if its spec
    /// reads back and has one.
    pub fn next_tick_ms(&self, now_ms: u64) -> Option<u64> {
        self.schedule()
            .ok()?
            .next_after(now_ms.max(self.through_ms))
    }

    /// Reads a row as stored (JSON; the name is the row's key).
    ///
    /// # Errors
    /// [`Error::InvalidSchedule`](crate::Error::InvalidSchedule) for bytes loops did not write.
    pub fn decode(name: &str, bytes: &[u8]) -> crate::Result<ScheduleInfo> {
        let mut info: ScheduleInfo =
            serde_json::from_slice(bytes).map_err(|e| crate::Error::InvalidSchedule {
                name: name.to_owned(),
                reason: format!("its stored row does not read: {e}"),
            })?;
        info.name = name.to_owned();
        Ok(info)
    }

    /// The row as stored (JSON, without the name): what [`decode`](Self::decode) reads.
    pub fn encode(&self) -> Vec<u8> {
        crate::record::to_vec(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOUR: u64 = 3_600_000;
    /// 2026-12-02T00:00:00Z.
    const DAY: u64 = 1_796_169_600_000;

    #[test]
    fn intervals_tick_at_multiples_since_the_epoch() {
        let s = Schedule::every(Duration::from_secs(3600)).unwrap();
        assert_eq!(s.next_after(DAY), Some(DAY + HOUR));
        assert_eq!(s.next_after(DAY + 1), Some(DAY + HOUR));
        assert_eq!(s.last_at_or_before(DAY + HOUR - 1), Some(DAY));
        assert_eq!(
            s.ticks_between(DAY, DAY + 3 * HOUR + 5, 10),
            vec![DAY + HOUR, DAY + 2 * HOUR, DAY + 3 * HOUR]
        );
        assert_eq!(
            s.ticks_between(DAY, DAY + 3 * HOUR, 2),
            vec![DAY + 2 * HOUR, DAY + 3 * HOUR]
        );
        assert!(s.ticks_between(DAY, DAY + HOUR - 1, 10).is_empty());
        assert_eq!(s.to_string(), "every 3600000ms");
        assert_eq!(Schedule::from_str("every 3600000ms").unwrap(), s);
        assert!(Schedule::every(Duration::from_micros(10)).is_err());
        assert_eq!(
            Schedule::every(Duration::from_millis(1))
                .unwrap()
                .next_after(u64::MAX),
            None
        );
    }

    #[test]
    fn cron_patterns_tick_in_their_time_zone() {
        let utc = Schedule::cron("0 9 * * *").unwrap();
        assert_eq!(utc.next_after(DAY), Some(DAY + 9 * HOUR));
        // Paris is UTC+1 in December: 9:00 there is 8:00 UTC.
        let paris = Schedule::cron_in("0  9 * * *", "Europe/Paris").unwrap();
        assert_eq!(paris.next_after(DAY), Some(DAY + 8 * HOUR));
        assert_eq!(paris.to_string(), "cron 0 9 * * * Europe/Paris");
        assert_eq!(
            Schedule::from_str("cron 0 9 * * * Europe/Paris").unwrap(),
            paris
        );
        assert_eq!(
            utc.ticks_between(DAY, DAY + 50 * HOUR, 10),
            vec![DAY + 9 * HOUR, DAY + 33 * HOUR]
        );
        assert_eq!(
            utc.ticks_between(DAY, DAY + 9 * HOUR + 999, 10),
            vec![DAY + 9 * HOUR]
        );
        assert_eq!(utc.next_after(DAY + 9 * HOUR + 500), Some(DAY + 33 * HOUR));
        let seconds = Schedule::cron("*/20 * * * * *").unwrap();
        assert_eq!(
            seconds.ticks_between(DAY, DAY + 60_500, 10),
            vec![DAY + 20_000, DAY + 40_000, DAY + 60_000]
        );
        assert!(Schedule::cron("61 * * * *").is_err());
        assert!(Schedule::cron_in("0 * * * *", "Mars/Olympus").is_err());
        assert!(Schedule::from_str("hourly").is_err());
    }

    #[test]
    fn a_tick_run_id_is_the_name_and_the_utc_time() {
        assert_eq!(
            tick_run_id("nightly", DAY + HOUR),
            "nightly@2026-12-02T01:00:00.000Z"
        );
        crate::names::validate_run_id(&tick_run_id(&"n".repeat(128), u64::MAX)).unwrap();
        assert_eq!(check_schedule_name("a.b-c_1"), Ok(()));
        assert!(check_schedule_name("a b").is_err());
        assert!(check_schedule_name("").is_err());
        assert!(check_schedule_name("a@b").is_err());
        for name in [".", "..", "-x", "_x"] {
            assert_eq!(
                check_schedule_name(name),
                Err("does not start with an ASCII letter or digit"),
                "{name}"
            );
        }
        let never = Schedule::cron("0 0 31 2 *").map(drop).unwrap_err();
        assert_eq!(
            never.to_string(),
            "cron pattern `0 0 31 2 *` never matches a time"
        );
        assert!(
            Schedule::cron("0 0 29 2 *").is_ok(),
            "a leap day's pattern ticks"
        );
    }
}
