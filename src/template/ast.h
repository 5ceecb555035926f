// The template's syntax tree: plain data built by the Parser and walked by the Interpreter.
// One generic node per expression and per statement keeps the tree small to build and to read;
// `kind` says which fields are used. Immutable after parsing; shared read-only across renders.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "template/lexer.h"
#include "template/value.h"

namespace bie::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind : uint8_t {
    kLiteral,  // value
    kName,     // name
    kList,     // children; name "tuple" for (a, b) and a, b
    kDict,     // children: key0, value0, key1, value1, ...
    kGetAttr,  // children[0] . name
    kGetItem,  // children[0] [ children[1] ]
    kSlice,    // children[0] [ children[1] : children[2] : children[3] ] (null = omitted)
    kCall,     // children[0] ( children[1..] , kwargs )
    kFilter,   // children[0] | name ( children[1..] , kwargs ); children[0] null in filter blocks
    kTest,     // children[0] is [not] name ( children[1..] ); negated
    kUnary,    // op children[0]: "-", "+", "not"
    kBinary,   // children[0] op children[1]: + - * / // % ** ~ and or
    kCompare,  // children[0] ops[0] children[1] ops[1] children[2] ...: == != < <= > >= in notin
    kCond,     // children[1] if children[0] else children[2] (null: undefined)
  };
  Kind kind = Kind::kLiteral;
  SourcePos pos;
  Value value;
  std::string name;  // name, attribute, filter/test name, operator
  std::vector<ExprPtr> children;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  std::vector<std::string> ops;  // kCompare
  bool negated = false;          // kTest
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

struct Stmt {
  enum class Kind : uint8_t {
    kText,         // text
    kOutput,       // {{ expr }}
    kIf,           // if expr: body else else_body (elif is an If inside else_body)
    kFor,          // for targets in expr [if cond]: body else else_body
    kSet,          // set targets (or targets[0].attr) = expr
    kSetBlock,     // set targets[0] [| filter expr]: body
    kMacro,        // macro name(params): body
    kCallBlock,    // call(params) expr: body (the body is `caller`)
    kFilterBlock,  // filter expr (a kFilter chain with a null innermost input): body
    kBreak,
    kContinue,
  };
  Kind kind = Kind::kText;
  SourcePos pos;
  std::string text;
  ExprPtr expr;
  ExprPtr cond;  // kFor's filter
  std::vector<std::string> targets;
  std::string attr;                                     // kSet of ns.attr
  std::string name;                                     // kMacro
  std::vector<std::pair<std::string, ExprPtr>> params;  // kMacro, kCallBlock (null: no default)
  bool recursive = false;                               // kFor
  Body body;
  Body else_body;
};

}  // namespace bie::jinja
