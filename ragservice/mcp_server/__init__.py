"""An MCP server (`ragservice mcp`): search, ask (with citations), list collections and read a
document as tools for agents, over stdio or streamable HTTP.

`tools` holds what each tool does over the REST API's client; `server` (which needs the `mcp`
extra) makes them an MCP server. Both reach the service only through `ragservice.client`, so an
API key scopes an agent exactly as it scopes a REST caller."""
