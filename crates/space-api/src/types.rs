//! Request and response bodies of the `/v1` API.
