"""DynamoDB: item operations one at a time, rollbacks from item backups, expressions parsed once.

moto's DynamoDB backend was written for one request at a time; under ``ThreadedMotoServer`` its
transactions and updates race each other. And it parses every expression text, and backs up whole
tables for every transaction, at a cost that grows with each request and each table where AWS's does
not. The emulator's functions send a handful of expression texts many times over.
"""

from __future__ import annotations

import copy
import functools
import pickle
import threading
from collections.abc import Callable, Mapping
from typing import Any

from moto.dynamodb import comparisons as dynamodb_comparisons
from moto.dynamodb import models as dynamodb_models
from moto.dynamodb import responses as dynamodb_responses
from moto.dynamodb.models.dynamo_type import DynamoType
from moto.dynamodb.models.table import Table as DynamoDBTable
from moto.dynamodb.parsing import ast_nodes as dynamodb_ast_nodes
from moto.dynamodb.parsing import expressions as dynamodb_expressions
from moto.dynamodb.parsing import validators as dynamodb_validators

from local.emulator.moto_patches.patch import Kind, Patch, Replacement

# moto's DynamoDBBackend methods that read or write a table's items dict; one lock serializes them.
_DYNAMODB_METHODS = (
    "transact_write_items",
    "put_item",
    "update_item",
    "delete_item",
    "get_item",
    "query",
    "scan",
)
# moto's answers to these copy or serialize the stored items themselves (an update's old and new
# item, a get, a query's page): under the same lock, or a request changing one meanwhile breaks them.
_DYNAMODB_ANSWERS = (
    "put_item",
    "update_item",
    "delete_item",
    "get_item",
    "batch_get_item",
    "batch_write_item",
    "query",
    "scan",
    "transact_get_items",
)
_dynamodb_lock = threading.RLock()


def _serialized(original: Any) -> Any:
    @functools.wraps(original)
    def serialized(self: Any, *args: Any, **kwargs: Any) -> Any:
        with _dynamodb_lock:
            return original(self, *args, **kwargs)

    return serialized


_transaction = threading.local()  # .active: inside a transaction wrapped by _backing_up_items


class _TablesNotCopied:
    """Stands in for the ``copy`` module in ``moto.dynamodb.models``: inside a wrapped transaction,
    ``deepcopy(table)`` is the table itself (its rollback then restores nothing), since
    :func:`_backing_up_items` keeps and restores the touched items instead; else ``copy``."""

    def __getattr__(self, name: str) -> Any:
        return getattr(copy, name)

    @staticmethod
    def deepcopy(value: Any, memo: Any = None) -> Any:
        if getattr(_transaction, "active", False) and isinstance(value, DynamoDBTable):
            return value
        return copy.deepcopy(value, memo)


def _item_key(table: DynamoDBTable, op: Mapping[str, Any]) -> tuple[DynamoType, DynamoType | None] | None:
    attrs = op.get("Key") or op.get("Item") or {}
    try:
        hash_value = DynamoType(attrs[table.hash_key_attr])
        range_value = DynamoType(attrs[table.range_key_attr]) if table.range_key_attr else None
    except (KeyError, TypeError):
        return None  # moto's own validation answers for a malformed entry
    return hash_value, range_value


def _restore(table: DynamoDBTable, hash_value: DynamoType, range_value: DynamoType | None, item: Any) -> None:
    if range_value is not None:
        if item is None:
            table.items.get(hash_value, {}).pop(range_value, None)
        else:
            table.items[hash_value][range_value] = item
    elif item is None:
        table.items.pop(hash_value, None)
    else:
        table.items[hash_value] = item


def _backing_up_items(original: Any) -> Any:
    """``TransactWriteItems`` rolled back from a copy of each item it touches (or its absence).

    With the item operations serialized (``dynamodb.serialized_item_operations``), nothing else can
    change a table during a transaction, so restoring the touched items restores exactly the state
    the table copies did. The cancellation reasons and error codes are moto's own.
    """

    @functools.wraps(original)
    def transact_write_items(self: Any, transact_items: list[dict[str, Any]]) -> None:
        with _dynamodb_lock:  # re-entrant: the same lock as the serialized item operations
            backups = []
            for entry in transact_items:
                op = next(iter(entry.values()), None) if isinstance(entry, dict) else None
                table = self.tables.get(op.get("TableName")) if isinstance(op, dict) else None
                key = _item_key(table, op) if table is not None and isinstance(op, dict) else None
                if table is None or key is None:
                    continue
                hash_value, range_value = key
                current = table.get_item(hash_value, range_value)
                backups.append((table, hash_value, range_value, copy.deepcopy(current)))
            _transaction.active = True
            try:
                original(self, transact_items)
            except BaseException:
                for table, hash_value, range_value, item in reversed(backups):
                    _restore(table, hash_value, range_value, item)
                raise
            finally:
                _transaction.active = False

    return transact_write_items


# An UpdateExpression's text -> its AST, and id(AST) -> (AST, its pickle). The cached ASTs are read and
# never changed (the validator works on a copy, made from the pickle); the second map holds them alive.
_update_asts: dict[str, Any] = {}
_update_ast_copies: dict[int, tuple[Any, bytes]] = {}
_UPDATE_AST_LIMIT = 4096  # distinct expression texts kept (the emulated functions use a handful)


def _parsed_once(make: Callable[[Any, str], Any]) -> Callable[[Any, str], Any]:
    """``UpdateExpressionParser.make`` cached by the expression's text: only successful parses are kept,
    and the tree is never changed (the validator works on a copy)."""

    def cached_make(cls: Any, expression_str: str) -> Any:
        ast = _update_asts.get(expression_str)
        if ast is None:
            ast = make(cls, expression_str)  # a syntax error raises here, each time, as before
            if len(_update_asts) >= _UPDATE_AST_LIMIT:
                _update_asts.clear()
                _update_ast_copies.clear()
            _update_ast_copies[id(ast)] = (ast, pickle.dumps(ast, protocol=pickle.HIGHEST_PROTOCOL))
            _update_asts[expression_str] = ast
        return ast

    return cached_make


def _copy_for_validation(value: Any, memo: Any = None) -> Any:
    """``deepcopy`` in ``moto.dynamodb.parsing.validators``: a cached AST is copied from its pickle
    (a third of deepcopy's time; the same tree of the same classes); anything else by ``deepcopy``."""
    entry = _update_ast_copies.get(id(value))
    if entry is not None and entry[0] is value and memo is None:
        return pickle.loads(entry[1])  # noqa: S301 - our own pickle of moto's own objects
    return copy.deepcopy(value, memo)


_processed_types: dict[type, tuple[type, ...]] = {}


def _nodes_to_be_processed(self: Any) -> tuple[type, ...]:
    """``DepthFirstTraverser.nodes_to_be_processed``, built once per traverser class instead of per node.

    The traversers of ``moto.dynamodb.parsing.validators`` list node classes as literal keys of their
    ``_processing_map``, so the tuple depends on the class only; any other traverser is asked each time.
    """
    cls = type(self)
    types = _processed_types.get(cls)
    if types is None:
        types = tuple(self._processing_map().keys())
        if cls.__module__ == dynamodb_validators.__name__:
            _processed_types[cls] = types
    return types


def _update_parser_and_traverser() -> tuple[Any, Any]:
    """moto's ``UpdateExpressionParser`` and ``DepthFirstTraverser`` (their modules are untyped)."""
    expressions: Any = dynamodb_expressions
    ast_nodes: Any = dynamodb_ast_nodes
    return expressions.UpdateExpressionParser, ast_nodes.DepthFirstTraverser


_UPDATE_PARSER, _TRAVERSER = _update_parser_and_traverser()


def _forget_update_expressions() -> None:
    _update_asts.clear()
    _update_ast_copies.clear()
    _processed_types.clear()


class _ValueName(str):
    """An expression attribute value's name (``:tokens``), standing in for its value in a cached tree."""


# (condition text, its names mapping, its values' names) -> (tree, names found, values found)
_condition_trees: dict[tuple[Any, ...], tuple[Any, tuple[str, ...], tuple[str, ...]]] = {}
_CONDITION_TREE_LIMIT = 4096  # distinct conditions kept (the emulated functions use a few dozen)


def _condition_tree(parser: Any) -> Any:
    """The steps of moto's ``ConditionExpressionParser.parse`` up to its syntax tree, in its order."""
    nodes = parser._lex_condition_expression()
    nodes = parser._parse_paths(nodes)
    nodes = parser._apply_functions(nodes)
    nodes = parser._apply_comparator(nodes)
    nodes = parser._apply_in(nodes)
    nodes = parser._apply_between(nodes)
    nodes = parser._apply_parens_and_booleans(nodes)
    node = nodes[0]
    parser._assert_no_redundant_parentheses(node)
    return node


def _parsed_condition_once(original: Any) -> Any:
    """``ConditionExpressionParser.parse`` with the tree built once per (text, names mapping, the values'
    names), each value left as its name (:class:`_ValueName`) and looked up for each request when the
    tree becomes moto's condition objects (:func:`_bound_operand`), as moto's own parse does last.
    Errors (syntax, a missing name or value, a keyword) are raised by moto's own code, each time."""

    def parse(self: Any) -> Any:
        expression = self.condition_expression
        if not expression:
            return original(self)
        values = self.expression_attribute_values
        key = (
            expression,
            tuple(sorted((self.expression_attribute_names or {}).items())),
            tuple(sorted(values)) if isinstance(values, dict) else values,
        )
        entry = _condition_trees.get(key)
        if entry is None:
            lookup = self._lookup_expression_attribute_value

            def by_name(name: str) -> _ValueName:
                lookup(name)  # a value the request does not define fails here, with moto's own error
                return _ValueName(name)

            self._lookup_expression_attribute_value = by_name
            try:
                node = _condition_tree(self)  # a syntax error raises here, each time, as before
            finally:
                del self._lookup_expression_attribute_value
            entry = (node, tuple(self._find_literals(node)), tuple(self._find_expr_attr_values(node)))
            if len(_condition_trees) >= _CONDITION_TREE_LIMIT:
                _condition_trees.clear()
            _condition_trees[key] = entry
        node, names_found, values_found = entry
        self.expr_attr_names_found.extend(names_found)
        self.expr_attr_values_found.extend(values_found)
        return self._make_op_condition(node)

    return parse


def _bound_operand(original: Any) -> Any:
    def make_operand(self: Any, node: Any) -> Any:
        if type(node.value) is _ValueName:
            return dynamodb_comparisons.AttributeValue(self._lookup_expression_attribute_value(node.value))
        return original(self, node)

    return make_operand


PATCHES = (
    Patch(
        name="dynamodb.serialized_item_operations",
        kind=Kind.CORRECTNESS,
        corrects="transact_write_items backs up every table it touches with copy.deepcopy (iterating its "
        "items) and restores that copy if a condition fails; update_item deep-copies the item. Under "
        "ThreadedMotoServer another request inserting into the same table meanwhile raises "
        "'dictionary changed size during iteration' (HTTP 500), and a rollback silently undoes writes "
        "other requests made since the backup. A transaction on AWS is atomic and isolated, so the "
        "backend's item operations (BatchWriteItem goes through put_item / delete_item) hold one "
        "re-entrant lock, as a single-threaded server would. The response handlers too: update_item "
        "deep-copies, and get_item, query and update_item serialize, the stored item outside the "
        "backend's call, which another request changing that item meanwhile breaks the same way.",
        replaces=(
            *(Replacement(dynamodb_models.DynamoDBBackend, name, _serialized) for name in _DYNAMODB_METHODS),
            *(Replacement(dynamodb_responses.DynamoHandler, name, _serialized) for name in _DYNAMODB_ANSWERS),
        ),
    ),
    Patch(
        name="dynamodb.transaction_item_backups",
        kind=Kind.SPEED,
        corrects="transact_write_items deep-copies every table it names before applying it, and puts the "
        "copies back if any entry fails: a cost that grows with the tables' items, paid under the lock "
        "of the serialized item operations, so every other DynamoDB request waits for it.",
        replaces=(
            Replacement(dynamodb_models.DynamoDBBackend, "transact_write_items", _backing_up_items),
            Replacement(dynamodb_models, "copy", lambda _original: _TablesNotCopied()),
        ),
    ),
    Patch(
        name="dynamodb.update_expressions_parsed_once",
        kind=Kind.SPEED,
        corrects="An UpdateItem's expression is parsed twice (the response handler to find the names and "
        "values it uses, the backend to validate it) by a hand-written tokenizer and parser, then the "
        "tree is deep-copied for the validator, whose ten traversals rebuild each traverser's list of "
        "node classes at every node. The parse is cached by text, the validator's copy of a cached tree "
        "comes from its pickle, and a traverser's node classes are listed once per class.",
        replaces=(
            Replacement(
                _UPDATE_PARSER, "make", lambda original: classmethod(_parsed_once(original.__func__))
            ),
            Replacement(dynamodb_validators, "deepcopy", lambda _original: _copy_for_validation),
            Replacement(_TRAVERSER, "nodes_to_be_processed", lambda _original: _nodes_to_be_processed),
        ),
        forget=_forget_update_expressions,
    ),
    Patch(
        name="dynamodb.conditions_parsed_once",
        kind=Kind.SPEED,
        corrects="Every ConditionExpression (and FilterExpression) is parsed by a hand-written lexer and "
        "parser, one regular expression per token, with the request's values put into the tree as it "
        "parses, so no tree could be reused: the emulated functions' conditions carry a new :now each "
        "time. The conditions' outcomes stay moto's own.",
        replaces=(
            Replacement(dynamodb_comparisons.ConditionExpressionParser, "parse", _parsed_condition_once),
            Replacement(dynamodb_comparisons.ConditionExpressionParser, "_make_operand", _bound_operand),
        ),
        forget=_condition_trees.clear,
    ),
)
