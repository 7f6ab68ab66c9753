-- Argo CD health of a VigilQueue. Healthy when Vigil has observed its spec (a queue that is
-- saturated or short of retry budget is working as configured, and says so in its message);
-- Suspended while spec.paused; Progressing until Vigil has written its status.
local hs = {status = "Progressing", message = "waiting for Vigil to observe the queue"}
if obj.status == nil or obj.status.observedGeneration == nil then
  return hs
end
if obj.metadata ~= nil and obj.metadata.generation ~= nil and obj.status.observedGeneration < obj.metadata.generation then
  hs.message = "Vigil has not observed the latest spec yet"
  return hs
end
local summary = string.format("%d queued, %d running", obj.status.queued or 0, obj.status.running or 0)
if obj.spec ~= nil and obj.spec.paused then
  return {status = "Suspended", message = "paused: " .. summary}
end
if obj.status.conditions ~= nil then
  for _, condition in ipairs(obj.status.conditions) do
    if condition.status == "True" and (condition.type == "Saturated" or condition.type == "RetryBudgetExhausted") then
      summary = summary .. "; " .. condition.type .. ": " .. (condition.message or "")
    end
  end
end
return {status = "Healthy", message = summary}
