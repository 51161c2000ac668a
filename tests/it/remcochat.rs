//! RemcoChat's client, as it is, against sandboxd's defaults.
