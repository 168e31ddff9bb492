"""Agents and frameworks against a real `ragservice serve`: `ragservice mcp` over stdio (started
by the `mcp` client), and the LangChain and LlamaIndex retrievers over HTTP."""

from __future__ import annotations

from typing import Any

import anyio
from mcp import Client, StdioServerParameters

from ragservice.integrations.langchain import RagserviceRetriever as LangChainRetriever
from ragservice.integrations.llamaindex import RagserviceRetriever as LlamaIndexRetriever
from tests.e2e.test_openai_client import _load_handbook
from tests.e2e.test_server import BIN, create_key, start_server, stop, wait_until_ready


def test_mcp_over_stdio_and_the_retrievers(server_env: dict[str, str]) -> None:
    base, process = start_server(server_env)
    try:
        wait_until_ready(base, process)
        _agents_and_retrievers(server_env, base)
    finally:
        if process.poll() is None:
            stop(process)


def _agents_and_retrievers(server_env: dict[str, str], base: str) -> None:
    key = create_key(server_env)
    _load_handbook(base, key)

    langchain = LangChainRetriever(url=base, api_key=key, collections=["handbook"], k=1)
    (leave,) = langchain.invoke("How long is parental leave?")
    assert leave.page_content == "Parents get sixteen weeks of leave."
    assert leave.metadata["document_id"] == "leave" and leave.metadata["title"] == "Leave"
    assert leave.metadata["collection"] == "handbook" and leave.metadata["score"] > 0
    (travel,) = anyio.run(langchain.ainvoke, "Where do I book trips?")
    assert travel.metadata["document_id"] == "travel"
    langchain.close()

    llamaindex = LlamaIndexRetriever(base, key, collections=["handbook"], k=2)
    found = llamaindex.retrieve("Where do I book trips?")
    assert [n.node.metadata["document_id"] for n in found] == ["travel", "leave"]
    assert found[0].node.get_content() == "Book trips at the travel desk."
    assert found[0].score is not None and found[0].score >= (found[1].score or 0)
    llamaindex.close()

    command = StdioServerParameters(
        command=str(BIN / "ragservice"),
        args=["mcp", "--url", base],
        env={**server_env, "RAGSERVICE_API_KEY": key},
    )

    async def agent() -> dict[str, Any]:
        async with Client(command) as mcp:
            tools = {tool.name for tool in (await mcp.list_tools()).tools}
            assert tools == {"search", "ask", "list_collections", "get_document"}
            result = await mcp.call_tool("ask", {"question": "How long is parental leave?"})
            assert not result.is_error and result.structured_content is not None
            return result.structured_content

    answered = anyio.run(agent)
    assert "sixteen weeks" in answered["answer"]
    assert answered["citations"][0]["document_id"] == "leave"
