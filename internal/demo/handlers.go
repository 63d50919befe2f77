package demo

import (
	"context"
	"sync"

	"github.com/agentmesh-io/agentmesh/agentkit"
	"github.com/agentmesh-io/agentmesh/agentkit/wire"
)

// customers is the demo's database: what the executors update and the
// validator reads back.
type customers struct {
	mu     sync.Mutex
	limits map[string]int
}

func newCustomers() *customers {
	return &customers{limits: map[string]int{"CUST001": 50000, "CUST002": 1000, "CUST003": 2000}}
}

func (c *customers) creditLimit(id string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.limits[id]
}

func (c *customers) setCreditLimit(id string, limit int) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.limits[id]; !ok {
		return false
	}
	c.limits[id] = limit
	return true
}

type task struct {
	TaskID      string `json:"task_id"`
	Description string `json:"description"`
	AgentType   string `json:"agent_type"`
	Operation   string `json:"operation,omitempty"`
}

type planPayload struct {
	Tasks []task `json:"tasks"`
}

type operation struct {
	Operation   string `json:"operation"`
	CustomerID  string `json:"customer_id"`
	CreditLimit int    `json:"credit_limit"`
}

// plan answers plan_workflow with a plan of three tasks.
func (m *Mesh) plan(ctx context.Context, msg *agentkit.Message) error {
	var req struct {
		Operation  string `json:"operation"`
		CustomerID string `json:"target_customer_id"`
	}
	if err := msg.DecodePayload(&req); err != nil || req.CustomerID == "" {
		return agentkit.Reject(wire.CodeInvalid, "plan_workflow needs operation and target_customer_id")
	}
	return msg.Reply(ctx, "plan_complete", planPayload{Tasks: []task{
		{TaskID: "t1", Description: "Fetch customer", AgentType: "executor", Operation: "fetch"},
		{TaskID: "t2", Description: "Update record", AgentType: "executor", Operation: req.Operation},
		{TaskID: "t3", Description: "Validate", AgentType: "validator"},
	}})
}

// execute answers execute_operation: fetch or update a customer.
func (m *Mesh) execute(ctx context.Context, msg *agentkit.Message) error {
	var op operation
	if err := msg.DecodePayload(&op); err != nil {
		return agentkit.Reject(wire.CodeInvalid, err.Error())
	}
	switch op.Operation {
	case "fetch":
		limit := m.db.creditLimit(op.CustomerID)
		if limit == 0 {
			return agentkit.Reject(wire.CodeNotFound, "customer "+op.CustomerID+" not found")
		}
		return msg.Reply(ctx, "execution_complete", map[string]any{
			"operation": "fetch", "customer_id": op.CustomerID, "record": map[string]int{"credit_limit": limit}, "success": true})
	case "update":
		if op.CreditLimit <= 0 {
			return agentkit.Reject(wire.CodeInvalid, "credit_limit must be positive")
		}
		if !m.db.setCreditLimit(op.CustomerID, op.CreditLimit) {
			return agentkit.Reject(wire.CodeNotFound, "customer "+op.CustomerID+" not found")
		}
		return msg.Reply(ctx, "execution_complete", map[string]any{
			"operation": "update", "customer_id": op.CustomerID, "updated_fields": []string{"credit_limit"}, "success": true})
	}
	return agentkit.Reject(wire.CodeInvalid, "unknown operation "+op.Operation)
}

// validate answers validate with validation_result.
func (m *Mesh) validate(ctx context.Context, msg *agentkit.Message) error {
	var req struct {
		CustomerID string         `json:"customer_id"`
		Expect     map[string]int `json:"expect"`
	}
	if err := msg.DecodePayload(&req); err != nil {
		return agentkit.Reject(wire.CodeInvalid, err.Error())
	}
	got := m.db.creditLimit(req.CustomerID)
	return msg.Reply(ctx, "validation_result", map[string]any{
		"customer_id": req.CustomerID, "valid": got == req.Expect["credit_limit"], "credit_limit": got})
}

// busyExecute NACKs (Busy) the first BusyAttempts deliveries of each
// message, then executes it.
func (m *Mesh) busyExecute(ctx context.Context, msg *agentkit.Message) error {
	if msg.Delivery <= uint64(m.cfg.BusyAttempts) {
		return agentkit.Busy(0) // redelivered on the priority's backoff
	}
	var op operation
	if err := msg.DecodePayload(&op); err != nil {
		return agentkit.Reject(wire.CodeInvalid, err.Error())
	}
	m.db.setCreditLimit(op.CustomerID, op.CreditLimit)
	return msg.Reply(ctx, "execution_complete", map[string]any{
		"operation": op.Operation, "customer_id": op.CustomerID, "success": true, "attempt": msg.Delivery})
}
