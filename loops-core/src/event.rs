//! Typed events: [`Event<T>`], the constant `#[derive(Workflow)]` generates for each
//! `#[event(name: Type)]` (`Deliver::APPROVE`), and [`EventName`], which lets
//! [`Context::wait_for`](crate::Context::wait_for) and [`Runtime::send`](crate::Runtime::send)
//! take either that constant (the payload type checked by the compiler) or a plain name.

use std::fmt;
use std::marker::PhantomData;

/// An event a workflow declares, with the type of its payload: `Deliver::APPROVE` for
/// `#[event(approve: Approval)]` on `enum Deliver`. Passed to
/// [`Context::wait_for`](crate::Context::wait_for) it returns a `T`; passed to
/// [`Runtime::send`](crate::Runtime::send) it takes a `&T`, so a payload of another type does
/// not compile.
pub struct Event<T> {
    name: &'static str,
    payload: PhantomData<fn() -> T>,
}

impl<T> Event<T> {
    /// The event `name` with payloads of type `T`. The derive makes these; a hand-made one is
    /// checked against nothing.
    pub const fn new(name: &'static str) -> Self {
        Event {
            name,
            payload: PhantomData,
        }
    }

    /// The event's name, as stored in a run's inbox and in the schema description.
    pub const fn name(&self) -> &'static str {
        self.name
    }
}

impl<T> Clone for Event<T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for Event<T> {}

impl<T> fmt::Debug for Event<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Event")
            .field(&self.name)
            .field(&std::any::type_name::<T>())
            .finish()
    }
}

impl<T> fmt::Display for Event<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name)
    }
}

/// What names an event whose payload is a `T`: a declared [`Event<T>`] (only for its own
/// `T`), or a plain name (`&str`, `String`: any `T`; [`Runtime::send`](crate::Runtime::send)
/// checks it against the events the run's workflow declares).
pub trait EventName<T: ?Sized> {
    /// The event's name.
    fn event_name(&self) -> &str;

    /// `true` for an [`Event<T>`], whose payload type the compiler checked; `false` (the
    /// default) for a plain name, which [`Runtime::send`](crate::Runtime::send) checks, with
    /// its payload, against the run's declared events before it writes.
    fn is_declared(&self) -> bool {
        false
    }
}

impl<T> EventName<T> for Event<T> {
    fn event_name(&self) -> &str {
        self.name
    }

    fn is_declared(&self) -> bool {
        true
    }
}

impl<T: ?Sized> EventName<T> for &str {
    fn event_name(&self) -> &str {
        self
    }
}

impl<T: ?Sized> EventName<T> for String {
    fn event_name(&self) -> &str {
        self
    }
}

impl<T: ?Sized> EventName<T> for &String {
    fn event_name(&self) -> &str {
        self
    }
}
