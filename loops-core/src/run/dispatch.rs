//! Handler dispatch: the trait through which the driver calls a state's handler.

use std::future::Future;

use crate::run::context::Context;
use crate::workflow::{BoxError, Workflow};

/// Runs the handler method of the current state: implemented by `#[derive(Workflow)]` for
/// every type that implements the generated `{Enum}Handler` trait.
///
/// The runtime calls it; users implement the generated handler trait instead.
pub trait Dispatch<H: ?Sized>: Workflow {
    /// Calls `handler`'s method for the state `self` is in, passing the state's data, and
    /// returns the next state.
    ///
    /// # Errors
    /// The handler's own error, boxed. For a terminal state (which has no handler) an error
    /// saying so; the runtime never dispatches a terminal state.
    fn dispatch(
        self,
        handler: &H,
        ctx: &Context,
    ) -> impl Future<Output = Result<Self, BoxError>> + Send;
}
