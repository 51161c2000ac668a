//! Every stable error `code` of the API, produced by a request that earns it.
