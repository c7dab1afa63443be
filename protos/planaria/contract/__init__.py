"""The types both planes share: plans, model shapes, profiles, and the schedules and
instructions every worker executes (the contract's Python side, beside planaria.v1 and
planaria.wire); the planner's algorithms (planaria.planner) and the agent build on them."""
