"""OpenAI's error body beside problem+json on the OpenAI-compatible resource routes.

The official `openai` SDK turns a 4xx into its error classes by status alone
(`openai.NotFoundError`, `BadRequestError`, ...), then reads `body["error"]` when there is one:
`exc.body` is that object and `exc.code`, `exc.param`, `exc.type` come from it. So the problem
stays a problem (RFC 9457 allows extension members) and carries `error: {message, type, param,
code}` too, on the routes OpenAI clients call (the graders' included). Other routes keep their
plain problems, whose `body` the SDK then hands over whole.
"""

from __future__ import annotations

from service.core.problems import PROBLEM_TYPE_ROOT, OpenAIError, Problem

# Path prefixes whose errors carry OpenAI's body (the routes of service/files,
# service/fine_tuning, service/graders and service/inference).
OPENAI_ERROR_PREFIXES = (
    "/v1/files",
    "/v1/fine_tuning/jobs",
    "/v1/fine_tuning/alpha/graders",
    "/v1/chat/completions",
    "/v1/completions",
)


def wants_openai_error(path: str) -> bool:
    return any(path == p or path.startswith(p + "/") for p in OPENAI_ERROR_PREFIXES)


def with_openai_error(problem: Problem) -> Problem:
    """The problem with its OpenAI-shaped `error` member."""
    param = None
    if problem.errors:
        first = problem.errors[0].path
        param = first[2:] if first.startswith("$.") else first
    # the problem type's name (`model-not-found`), else its title's (`not_found`)
    kind = problem.type.removeprefix(PROBLEM_TYPE_ROOT)
    if kind == problem.type:  # about:blank: a problem the framework raised
        kind = problem.title.lower()
    error = OpenAIError(
        message=problem.detail,
        type="server_error" if problem.status >= 500 else "invalid_request_error",
        param=param,
        code=kind.replace("-", "_").replace(" ", "_"),
    )
    return problem.model_copy(update={"error": error})
