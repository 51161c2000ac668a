//! Where a key's value comes from: its environment variable, else the file,
//! else its default; and how each type a key can have reads from an
//! environment string or a TOML value.

use std::net::IpAddr;
use std::time::Duration;

use super::ConfigError;

/// A type a key can have: read from an environment string or a TOML value,
/// and shown as TOML (for the example file's check).
pub(super) trait Setting: Sized {
    fn from_env(s: &str) -> Result<Self, String>;
    fn from_toml(v: &toml::Value) -> Result<Self, String>;
    fn to_toml(&self) -> Option<toml::Value>;
}

macro_rules! integer_setting {
    ($($t:ty),*) => {$(
        impl Setting for $t {
            fn from_env(s: &str) -> Result<Self, String> {
                s.trim().parse().map_err(|_| format!("{s:?} is not a valid number here"))
            }
            fn from_toml(v: &toml::Value) -> Result<Self, String> {
                v.as_integer()
                    .and_then(|i| <$t>::try_from(i).ok())
                    .ok_or_else(|| format!("{v} is not a valid number here"))
            }
            fn to_toml(&self) -> Option<toml::Value> {
                i64::try_from(*self).ok().map(toml::Value::Integer)
            }
        }
    )*};
}
integer_setting!(u16, u32, u64, usize, i64);

impl Setting for bool {
    fn from_env(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "1" | "true" | "yes" | "on" => Ok(true),
            "0" | "false" | "no" | "off" => Ok(false),
            _ => Err(format!("{s:?} is not a boolean (use true/false or 1/0)")),
        }
    }
    fn from_toml(v: &toml::Value) -> Result<Self, String> {
        v.as_bool()
            .ok_or_else(|| format!("{v} is not a boolean (use true or false)"))
    }
    fn to_toml(&self) -> Option<toml::Value> {
        Some(toml::Value::Boolean(*self))
    }
}

impl Setting for String {
    fn from_env(s: &str) -> Result<Self, String> {
        Ok(s.to_string())
    }
    fn from_toml(v: &toml::Value) -> Result<Self, String> {
        v.as_str()
            .map(str::to_string)
            .ok_or_else(|| format!("{v} is not a string"))
    }
    fn to_toml(&self) -> Option<toml::Value> {
        Some(toml::Value::String(self.clone()))
    }
}

impl Setting for IpAddr {
    fn from_env(s: &str) -> Result<Self, String> {
        let s = s.trim();
        if s == "localhost" {
            return Ok(IpAddr::from([127, 0, 0, 1]));
        }
        s.parse().map_err(|_| format!("{s:?} is not an IP address"))
    }
    fn from_toml(v: &toml::Value) -> Result<Self, String> {
        Self::from_env(&String::from_toml(v)?)
    }
    fn to_toml(&self) -> Option<toml::Value> {
        Some(toml::Value::String(self.to_string()))
    }
}

/// Milliseconds in the file and the environment.
impl Setting for Duration {
    fn from_env(s: &str) -> Result<Self, String> {
        u64::from_env(s).map(Duration::from_millis)
    }
    fn from_toml(v: &toml::Value) -> Result<Self, String> {
        u64::from_toml(v).map(Duration::from_millis)
    }
    fn to_toml(&self) -> Option<toml::Value> {
        u64::try_from(self.as_millis()).ok()?.to_toml()
    }
}

/// A list: comma-separated in the environment, an array in the file.
impl Setting for Vec<String> {
    fn from_env(s: &str) -> Result<Self, String> {
        Ok(s.split(',')
            .map(str::trim)
            .filter(|p| !p.is_empty())
            .map(str::to_string)
            .collect())
    }
    fn from_toml(v: &toml::Value) -> Result<Self, String> {
        v.as_array()
            .ok_or_else(|| format!("{v} is not an array of strings"))?
            .iter()
            .map(String::from_toml)
            .collect()
    }
    fn to_toml(&self) -> Option<toml::Value> {
        Some(toml::Value::Array(
            self.iter()
                .map(|s| toml::Value::String(s.clone()))
                .collect(),
        ))
    }
}

/// A key with no default: absent unless set.
impl<T: Setting> Setting for Option<T> {
    fn from_env(s: &str) -> Result<Self, String> {
        T::from_env(s).map(Some)
    }
    fn from_toml(v: &toml::Value) -> Result<Self, String> {
        T::from_toml(v).map(Some)
    }
    fn to_toml(&self) -> Option<toml::Value> {
        self.as_ref().and_then(T::to_toml)
    }
}

/// Where the values come from: the file's table and the environment.
pub(super) struct Sources<'a> {
    pub(super) file: &'a toml::Table,
    pub(super) file_name: &'a str,
    pub(super) env: &'a dyn Fn(&str) -> Option<String>,
}

impl Sources<'_> {
    /// The value of `key`: its variable (empty counts as unset), else the
    /// file, else `default`; and the name to blame for it, which is the
    /// one the operator set it by.
    pub(super) fn get<T: Setting>(
        &self,
        key: &str,
        default: T,
    ) -> Result<(T, String), ConfigError> {
        let var = env_var(key);
        if let Some(v) = (self.env)(&var).filter(|v| !v.is_empty()) {
            let blame = format!("{var} ({key})");
            return T::from_env(&v)
                .map(|t| (t, blame.clone()))
                .map_err(|reason| ConfigError::invalid(&blame, reason));
        }
        match self.file.get(key) {
            Some(v) => T::from_toml(v)
                .map(|t| (t, key.to_string()))
                .map_err(|reason| ConfigError::Parse {
                    path: self.file_name.to_string(),
                    reason: format!("{key}: {reason}"),
                }),
            None => Ok((default, key.to_string())),
        }
    }
}

/// The environment variable of a key.
pub fn env_var(key: &str) -> String {
    format!("SANDBOXD_{}", key.to_ascii_uppercase())
}
