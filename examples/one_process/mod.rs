//! Both sides of an example in one process: one verdict from the two.

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The two sides' results as one, each side named. The server's error
/// comes first: when the server fails, the client mostly sees only its
/// connection closing under it, which alone would hide the cause. When
/// both failed, both are shown, since either may be the cause.
pub fn verdict<S, C>(
    (server_name, server): (&str, std::thread::Result<Result<S, BoxError>>),
    (client_name, client): (&str, Result<C, BoxError>),
) -> Result<(S, C), BoxError> {
    let server =
        server.unwrap_or_else(|_| Err(format!("the {server_name} thread panicked").into()));
    match (server, client) {
        (Ok(s), Ok(c)) => Ok((s, c)),
        (Err(s), Ok(_)) => Err(format!("{server_name}: {s}").into()),
        (Ok(_), Err(c)) => Err(format!("{client_name}: {c}").into()),
        (Err(s), Err(c)) => Err(format!("{server_name}: {s}; {client_name}: {c}").into()),
    }
}
