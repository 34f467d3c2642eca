//! The store's schema: one list of migrations, each table written once and
//! rendered for its SQL dialect (SQLite and MySQL/MariaDB differ only in
//! auto-increment keys, table options, where indexes are declared and
//! "insert unless present"). The binary applies them on first use;
//! `schema_migrations` records which ran.
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

/// One schema change, written once: tables (rendered per dialect) and
/// statements that are the same on both.
pub struct Migration {
    pub version: i64,
    pub description: &'static str,
    steps: &'static [Step],
}

enum Step {
    Table(Table),
    /// Creates the row unless it exists (`INSERT OR IGNORE` / `INSERT IGNORE`).
    InsertIgnore(&'static str),
    /// `ALTER TABLE t ADD COLUMN …`; the migration runner ignores a
    /// "duplicate column" error (another process added it first).
    AddColumn(&'static str, &'static str),
}

/// Is this error the one an `AddColumn` step gives when the column exists?
pub fn is_duplicate_column(e: &str) -> bool {
    e.to_ascii_lowercase().contains("duplicate column")
}

/// `CREATE TABLE IF NOT EXISTS`: `columns` may start a column with `{id}`,
/// an auto-increment primary key; `indexes` are `(name, columns)`, created
/// with the table on MySQL and as separate `CREATE INDEX IF NOT EXISTS` on
/// SQLite (so every statement stays idempotent on both).
struct Table {
    name: &'static str,
    columns: &'static str,
    indexes: &'static [(&'static str, &'static str)],
}

impl Migration {
    pub fn statements(&self, d: Dialect) -> Vec<String> {
        let mut out = Vec::new();
        for step in self.steps {
            match step {
                Step::InsertIgnore(rest) => out.push(match d {
                    Dialect::Sqlite => format!("INSERT OR IGNORE {rest}"),
                    Dialect::MySql => format!("INSERT IGNORE {rest}"),
                }),
                Step::Table(t) => t.render(d, &mut out),
                Step::AddColumn(table, column) => {
                    out.push(format!("ALTER TABLE {table} ADD COLUMN {column}"))
                }
            }
        }
        out
    }
}

impl Table {
    fn render(&self, d: Dialect, out: &mut Vec<String>) {
        let (id, options) = match d {
            Dialect::Sqlite => ("id INTEGER PRIMARY KEY AUTOINCREMENT", ""),
            // InnoDB, and a binary collation so that names and values compare
            // byte for byte, as the shared-memory table does.
            Dialect::MySql => (
                "id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY",
                " ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin",
            ),
        };
        let mut columns = self.columns.replace("{id}", id);
        if d == Dialect::MySql {
            for (name, cols) in self.indexes {
                columns.push_str(&format!(", KEY {name} ({cols})"));
            }
        }
        out.push(format!(
            "CREATE TABLE IF NOT EXISTS {} ({columns}){options}",
            self.name
        ));
        if d == Dialect::Sqlite {
            for (name, cols) in self.indexes {
                out.push(format!(
                    "CREATE INDEX IF NOT EXISTS {name} ON {} ({cols})",
                    self.name
                ));
            }
        }
    }
}

pub const CREATE_MIGRATIONS_TABLE: &str = "CREATE TABLE IF NOT EXISTS schema_migrations (\
     version BIGINT NOT NULL PRIMARY KEY, description VARCHAR(200) NOT NULL, \
     applied_ms BIGINT NOT NULL)";

pub const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        description: "config version, strategies, blacklist, hosts",
        steps: &[
            Step::Table(Table {
                name: "config_version",
                columns: "id BIGINT NOT NULL PRIMARY KEY,
                    version BIGINT NOT NULL,
                    changed_ms BIGINT NOT NULL",
                indexes: &[],
            }),
            Step::InsertIgnore("INTO config_version (id, version, changed_ms) VALUES (1, 1, 0)"),
            Step::Table(Table {
                name: "strategies",
                columns: "{id},
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
                    CONSTRAINT strategies_name UNIQUE (name)",
                indexes: &[],
            }),
            Step::Table(Table {
                name: "blacklist",
                columns: "{id},
                    dimension VARCHAR(32) NOT NULL,
                    value VARCHAR(256) NOT NULL,
                    expires_ms BIGINT NULL,
                    reason VARCHAR(500) NOT NULL,
                    created_ms BIGINT NOT NULL,
                    CONSTRAINT blacklist_dimension_value UNIQUE (dimension, value)",
                indexes: &[],
            }),
            Step::Table(Table {
                name: "hosts",
                columns: "host_id VARCHAR(255) NOT NULL PRIMARY KEY,
                    weight BIGINT NOT NULL,
                    last_heartbeat_ms BIGINT NULL,
                    applied_version BIGINT NULL,
                    applied_ms BIGINT NULL,
                    registered_ms BIGINT NOT NULL",
                indexes: &[],
            }),
        ],
    },
    Migration {
        version: 2,
        description: "audit log, counter samples for the stats series",
        steps: &[
            Step::Table(Table {
                name: "audit_log",
                columns: "{id},
                    at_ms BIGINT NOT NULL,
                    token VARCHAR(32) NOT NULL,
                    action VARCHAR(64) NOT NULL,
                    target VARCHAR(300) NOT NULL,
                    before_json VARCHAR(7000) NULL,
                    after_json VARCHAR(7000) NULL",
                indexes: &[],
            }),
            Step::Table(Table {
                name: "counter_samples",
                columns: "host_id VARCHAR(255) NOT NULL,
                    strategy_id BIGINT NOT NULL,
                    at_ms BIGINT NOT NULL,
                    passed_count BIGINT NOT NULL,
                    limited_count BIGINT NOT NULL,
                    delayed_count BIGINT NOT NULL",
                indexes: &[
                    ("counter_samples_strategy", "strategy_id, at_ms"),
                    ("counter_samples_at", "at_ms"),
                ],
            }),
        ],
    },
    Migration {
        version: 3,
        description: "warm_up strategies: warm-up period and cold factor",
        steps: &[
            Step::AddColumn("strategies", "warm_up_ms BIGINT NULL"),
            Step::AddColumn("strategies", "cold_factor BIGINT NULL"),
        ],
    },
    Migration {
        version: 4,
        description: "hosts: the agent's last publish error and its time",
        steps: &[
            Step::AddColumn("hosts", "publish_error VARCHAR(1000) NULL"),
            Step::AddColumn("hosts", "publish_error_ms BIGINT NULL"),
        ],
    },
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_dialect_gets_its_keys_options_and_indexes() {
        let lite = MIGRATIONS[1].statements(Dialect::Sqlite);
        let my = MIGRATIONS[1].statements(Dialect::MySql);
        assert!(
            lite[0].contains("id INTEGER PRIMARY KEY AUTOINCREMENT"),
            "{}",
            lite[0]
        );
        assert!(
            my[0].contains("id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY"),
            "{}",
            my[0]
        );
        assert!(my[0].ends_with("COLLATE=utf8mb4_bin"), "{}", my[0]);
        assert_eq!(lite.len(), 4, "two tables, two separate indexes: {lite:?}");
        assert_eq!(my.len(), 2, "indexes inside the table: {my:?}");
        assert!(
            my[1].contains(", KEY counter_samples_at (at_ms))"),
            "{}",
            my[1]
        );
        assert_eq!(
            lite[3],
            "CREATE INDEX IF NOT EXISTS counter_samples_at ON counter_samples (at_ms)"
        );
        assert!(MIGRATIONS[0].statements(Dialect::Sqlite)[1].starts_with("INSERT OR IGNORE INTO"));
        assert!(MIGRATIONS[0].statements(Dialect::MySql)[1].starts_with("INSERT IGNORE INTO"));
    }
}
