//! The SQL dialect hawser parses: sqlparser's `GenericDialect`, with statement nesting
//! bounded.
//!
//! sqlparser guards its recursion with a counter, and grows the stack on the heap for
//! expressions, queries, table factors and types, but not for statements inside
//! statements (`EXPLAIN EXPLAIN ...`, `PREPARE p AS ...`, `IF ... THEN` blocks). A
//! level of those took 25 KB of stack in a debug build, so the counter that lets
//! expressions nest [`crate::limits::PARSER_RECURSION_LIMIT`] deep would let 84 nested
//! `EXPLAIN`s overflow a 2 MiB worker. [`Dialect`] counts statement levels through
//! sqlparser's `parse_statement` hook and stops at [`MAX_STATEMENT_DEPTH`].
//!
//! Everything else is `GenericDialect`'s: [`Dialect`] forwards every method
//! `GenericDialect` overrides (sqlparser 0.64) and claims its type, so the parser's
//! `dialect_of!(... GenericDialect)` checks still hold. A new sqlparser may override
//! more, and this list must follow it.

use std::any::TypeId;
use std::cell::Cell;

use sqlparser::ast::Statement;
use sqlparser::dialect::GenericDialect;
use sqlparser::parser::{Parser, ParserError};

use crate::limits::MAX_STATEMENT_DEPTH;

/// `GenericDialect` with at most [`MAX_STATEMENT_DEPTH`] levels of statements.
#[derive(Debug, Default)]
pub struct Dialect {
    generic: GenericDialect,
    /// Statement levels being parsed.
    depth: Cell<usize>,
    /// Set just before the hook calls `parse_statement` itself, so that the hook lets
    /// that call parse as usual.
    reentered: Cell<bool>,
    /// Whether a statement was refused for nesting too deep.
    refused: Cell<bool>,
}

impl Dialect {
    /// Parses the next statement of the script.
    pub fn statement(&self, parser: &mut Parser<'_>) -> Result<Statement, ParserError> {
        self.refused.set(false);
        self.nested(parser, 0)
    }

    /// Whether the last error was a statement nested past [`MAX_STATEMENT_DEPTH`]
    /// (reported by sqlparser as its recursion limit).
    pub fn refused(&self) -> bool {
        self.refused.get()
    }

    fn nested(&self, parser: &mut Parser<'_>, depth: usize) -> Result<Statement, ParserError> {
        if depth >= MAX_STATEMENT_DEPTH {
            self.refused.set(true);
            return Err(ParserError::RecursionLimitExceeded);
        }
        self.depth.set(depth + 1);
        self.reentered.set(true);
        let statement = parser.parse_statement();
        self.reentered.set(false);
        self.depth.set(depth);
        statement
    }
}

macro_rules! forward {
    ($($name:ident,)*) => {
        $(
            fn $name(&self) -> bool {
                self.generic.$name()
            }
        )*
    };
}

impl sqlparser::dialect::Dialect for Dialect {
    fn dialect(&self) -> TypeId {
        TypeId::of::<GenericDialect>()
    }

    fn parse_statement(&self, parser: &mut Parser<'_>) -> Option<Result<Statement, ParserError>> {
        if self.reentered.replace(false) {
            return None;
        }
        Some(self.nested(parser, self.depth.get()))
    }

    fn is_delimited_identifier_start(&self, ch: char) -> bool {
        self.generic.is_delimited_identifier_start(ch)
    }

    fn is_identifier_start(&self, ch: char) -> bool {
        self.generic.is_identifier_start(ch)
    }

    fn is_identifier_part(&self, ch: char) -> bool {
        self.generic.is_identifier_part(ch)
    }

    forward! {
        supports_map_typedef_with_parentheses,
        supports_unicode_string_literal,
        supports_literal_prefix_in_qualified_name,
        supports_partition_by_after_order_by,
        supports_array_join_syntax,
        supports_group_by_expr,
        supports_group_by_with_modifier,
        supports_left_associative_joins_without_parens,
        supports_connect_by,
        supports_match_recognize,
        supports_pipe_operator,
        supports_start_transaction_modifier,
        supports_window_function_null_treatment_arg,
        supports_dictionary_syntax,
        supports_window_clause_named_window_reference,
        supports_parenthesized_set_variables,
        supports_select_wildcard_except,
        support_map_literal_syntax,
        allow_extract_custom,
        allow_extract_single_quotes,
        supports_extract_comma_syntax,
        supports_create_view_comment_syntax,
        supports_parens_around_table_factor,
        supports_values_as_table_factor,
        supports_create_index_with_clause,
        supports_sql_option_without_value,
        supports_explain_with_utility_options,
        supports_exclude_constraint,
        supports_limit_comma,
        supports_update_order_by,
        supports_from_first_select,
        supports_projection_trailing_commas,
        supports_asc_desc_in_column_definition,
        supports_try_convert,
        supports_bitwise_shift_operators,
        supports_singular_value_keyword,
        supports_comma_join_constraint,
        supports_tilde_like_match_operator,
        supports_aggregate_order_by_with_empty_args,
        supports_in_table_expression,
        supports_comparison_in_between_low_bound,
        supports_comment_on,
        supports_load_extension,
        supports_named_fn_args_with_assignment_operator,
        supports_struct_literal,
        supports_empty_projections,
        supports_nested_comments,
        supports_multiline_comment_hints,
        supports_copy_from_stdin_data,
        supports_user_host_grantee,
        supports_string_escape_constant,
        supports_array_typedef_with_brackets,
        supports_match_against,
        supports_set_names,
        supports_comma_separated_set_assignments,
        supports_filter_during_aggregation,
        supports_select_wildcard_exclude,
        supports_data_type_signed_suffix,
        supports_data_type_zerofill_suffix,
        supports_interval_options,
        supports_quote_delimited_string,
        supports_select_wildcard_replace,
        supports_select_wildcard_ilike,
        supports_select_wildcard_rename,
        supports_optimize_table,
        supports_install,
        supports_detach,
        supports_prewhere,
        supports_with_fill,
        supports_limit_by,
        supports_interpolate,
        supports_settings,
        supports_table_partitions,
        supports_table_inheritance_markers,
        supports_select_format,
        supports_comment_optimizer_hint,
        supports_constraint_keyword_without_name,
        supports_key_column_option,
        supports_comma_separated_trim,
        supports_cte_without_as,
        supports_select_item_multi_column_alias,
        supports_xml_expressions,
        supports_aliased_function_args,
        supports_alter_column_position,
        supports_add_column_if_not_exists,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(dialect: &dyn sqlparser::dialect::Dialect, sql: &str) -> Vec<Statement> {
        Parser::parse_sql(dialect, sql).expect("parses")
    }

    #[test]
    fn parses_as_the_generic_dialect() {
        let sql = "create table t (k int primary key, c varchar2(5) default 'a' not null);
            insert t values (1, 'x'); delete t where k = 1;
            select a.k, count(*) from t a where k between 1 and 2 or c like 'x%' escape '!'
              group by a.k having count(*) > 1 order by 1 desc nulls first limit 5 offset 1;
            select s.nextval, date '2026-01-02', x'0a', cast(k as number(5,2)), k || 'a'
              from dual;
            update t set c = case when k is null then 'n' else upper(c) end where k in (1, 2);
            explain analyze select * from t where \"K\" = 1; begin; commit; rollback;
            create sequence s increment by 2 start with 5 cycle; drop table if exists t";
        assert_eq!(
            parse(&Dialect::default(), sql),
            parse(&GenericDialect {}, sql)
        );
    }

    #[test]
    fn statements_nest_at_most_the_limit() {
        let nested = |n: usize| format!("{}select 1", "explain ".repeat(n - 1));
        let d = Dialect::default();
        let statement = |sql: &str| {
            let mut p = Parser::new(&d).try_with_sql(sql).expect("tokenizes");
            d.statement(&mut p)
        };
        assert!(statement(&nested(MAX_STATEMENT_DEPTH)).is_ok());
        assert!(!d.refused());
        let e = statement(&nested(MAX_STATEMENT_DEPTH + 1)).unwrap_err();
        assert_eq!(e, ParserError::RecursionLimitExceeded);
        assert!(d.refused());
    }
}
