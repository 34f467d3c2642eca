//! The store's schema: one list of migrations, each written once per SQL
//! dialect (SQLite and MySQL/MariaDB differ only in auto-increment keys,
//! table options and "insert unless present"). The binary applies them on
//! first use; `schema_migrations` records which ran.
//!
//! Column types stay within what sqlx's Any driver decodes on both
//! backends: BIGINT and VARCHAR (no BOOLEAN/TINYINT, no TEXT, which MySQL
//! reports as a blob). Times are Unix milliseconds.

/// SQL dialect of a store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    Sqlite,
    MySql,
}

pub struct Migration {
    pub version: i64,
    pub description: &'static str,
    sqlite: &'static [&'static str],
    mysql: &'static [&'static str],
}

impl Migration {
    pub fn statements(&self, d: Dialect) -> &'static [&'static str] {
        match d {
            Dialect::Sqlite => self.sqlite,
            Dialect::MySql => self.mysql,
        }
    }
}

pub const CREATE_MIGRATIONS_TABLE: &str = "CREATE TABLE IF NOT EXISTS schema_migrations (\
     version BIGINT NOT NULL PRIMARY KEY, description VARCHAR(200) NOT NULL, \
     applied_ms BIGINT NOT NULL)";

/// MySQL table options: InnoDB, and a binary collation so that names and
/// values compare byte for byte, as the shared-memory table does.
macro_rules! mysql_table {
    ($create:literal) => {
        concat!(
            $create,
            "ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin"
        )
    };
}

pub const MIGRATIONS: &[Migration] = &[Migration {
    version: 1,
    description: "config version, strategies, blacklist, hosts",
    sqlite: &[
        "CREATE TABLE IF NOT EXISTS config_version (
            id BIGINT NOT NULL PRIMARY KEY,
            version BIGINT NOT NULL,
            changed_ms BIGINT NOT NULL)",
        "INSERT OR IGNORE INTO config_version (id, version, changed_ms) VALUES (1, 1, 0)",
        "CREATE TABLE IF NOT EXISTS strategies (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            name VARCHAR(200) NOT NULL UNIQUE,
            conditions VARCHAR(12000) NOT NULL,
            algorithm VARCHAR(32) NOT NULL,
            rate BIGINT NOT NULL,
            per VARCHAR(16) NOT NULL,
            burst BIGINT NOT NULL,
            action VARCHAR(16) NOT NULL,
            status BIGINT NULL,
            max_delay_ms BIGINT NULL,
            enabled BIGINT NOT NULL,
            scope VARCHAR(16) NOT NULL,
            created_ms BIGINT NOT NULL,
            updated_ms BIGINT NOT NULL,
            version BIGINT NOT NULL)",
        "CREATE TABLE IF NOT EXISTS blacklist (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            dimension VARCHAR(32) NOT NULL,
            value VARCHAR(256) NOT NULL,
            expires_ms BIGINT NULL,
            reason VARCHAR(500) NOT NULL,
            created_ms BIGINT NOT NULL,
            UNIQUE (dimension, value))",
        "CREATE TABLE IF NOT EXISTS hosts (
            host_id VARCHAR(255) NOT NULL PRIMARY KEY,
            weight BIGINT NOT NULL,
            last_heartbeat_ms BIGINT NULL,
            applied_version BIGINT NULL,
            applied_ms BIGINT NULL,
            registered_ms BIGINT NOT NULL)",
    ],
    mysql: &[
        mysql_table!(
            "CREATE TABLE IF NOT EXISTS config_version (
            id BIGINT NOT NULL PRIMARY KEY,
            version BIGINT NOT NULL,
            changed_ms BIGINT NOT NULL) "
        ),
        "INSERT IGNORE INTO config_version (id, version, changed_ms) VALUES (1, 1, 0)",
        mysql_table!(
            "CREATE TABLE IF NOT EXISTS strategies (
            id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
            name VARCHAR(200) NOT NULL,
            conditions VARCHAR(12000) NOT NULL,
            algorithm VARCHAR(32) NOT NULL,
            rate BIGINT NOT NULL,
            per VARCHAR(16) NOT NULL,
            burst BIGINT NOT NULL,
            action VARCHAR(16) NOT NULL,
            status BIGINT NULL,
            max_delay_ms BIGINT NULL,
            enabled BIGINT NOT NULL,
            scope VARCHAR(16) NOT NULL,
            created_ms BIGINT NOT NULL,
            updated_ms BIGINT NOT NULL,
            version BIGINT NOT NULL,
            UNIQUE KEY strategies_name (name)) "
        ),
        mysql_table!(
            "CREATE TABLE IF NOT EXISTS blacklist (
            id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
            dimension VARCHAR(32) NOT NULL,
            value VARCHAR(256) NOT NULL,
            expires_ms BIGINT NULL,
            reason VARCHAR(500) NOT NULL,
            created_ms BIGINT NOT NULL,
            UNIQUE KEY blacklist_dimension_value (dimension, value)) "
        ),
        mysql_table!(
            "CREATE TABLE IF NOT EXISTS hosts (
            host_id VARCHAR(255) NOT NULL PRIMARY KEY,
            weight BIGINT NOT NULL,
            last_heartbeat_ms BIGINT NULL,
            applied_version BIGINT NULL,
            applied_ms BIGINT NULL,
            registered_ms BIGINT NOT NULL) "
        ),
    ],
},
Migration {
    version: 2,
    description: "audit log, counter samples for the stats series",
    sqlite: &[
        "CREATE TABLE IF NOT EXISTS audit_log (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            at_ms BIGINT NOT NULL,
            token VARCHAR(32) NOT NULL,
            action VARCHAR(64) NOT NULL,
            target VARCHAR(300) NOT NULL,
            before_json VARCHAR(7000) NULL,
            after_json VARCHAR(7000) NULL)",
        "CREATE TABLE IF NOT EXISTS counter_samples (
            host_id VARCHAR(255) NOT NULL,
            strategy_id BIGINT NOT NULL,
            at_ms BIGINT NOT NULL,
            passed_count BIGINT NOT NULL,
            limited_count BIGINT NOT NULL,
            delayed_count BIGINT NOT NULL)",
        "CREATE INDEX IF NOT EXISTS counter_samples_strategy ON counter_samples (strategy_id, at_ms)",
        "CREATE INDEX IF NOT EXISTS counter_samples_at ON counter_samples (at_ms)",
    ],
    mysql: &[
        mysql_table!(
            "CREATE TABLE IF NOT EXISTS audit_log (
            id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
            at_ms BIGINT NOT NULL,
            token VARCHAR(32) NOT NULL,
            action VARCHAR(64) NOT NULL,
            target VARCHAR(300) NOT NULL,
            before_json VARCHAR(7000) NULL,
            after_json VARCHAR(7000) NULL) "
        ),
        mysql_table!(
            "CREATE TABLE IF NOT EXISTS counter_samples (
            host_id VARCHAR(255) NOT NULL,
            strategy_id BIGINT NOT NULL,
            at_ms BIGINT NOT NULL,
            passed_count BIGINT NOT NULL,
            limited_count BIGINT NOT NULL,
            delayed_count BIGINT NOT NULL,
            KEY counter_samples_strategy (strategy_id, at_ms),
            KEY counter_samples_at (at_ms)) "
        ),
    ],
}];
