-- Argo CD health of a VigilJob (Argo CD has no generic check for custom resources).
-- Progressing while it runs or waits, Healthy once Succeeded, Degraded once DeadLettered,
-- Suspended while spec.suspend holds it. A status that has not caught up with the spec
-- (observedGeneration behind metadata.generation) is Progressing: Vigil has not seen it yet.
local hs = {status = "Progressing", message = "waiting for Vigil to pick the job up"}
if obj.status == nil then
  return hs
end
local status = obj.status
if obj.metadata ~= nil and status.observedGeneration ~= nil and obj.metadata.generation ~= nil
    and status.observedGeneration < obj.metadata.generation then
  hs.message = "Vigil has not observed the latest spec yet"
  return hs
end
local message = status.message or status.reason or ""
if status.phase == "Succeeded" then
  return {status = "Healthy", message = message}
end
if status.phase == "DeadLettered" then
  return {status = "Degraded", message = message}
end
if status.phase == "Suspended" then
  return {status = "Suspended", message = message}
end
if status.phase ~= nil then
  hs.message = status.phase .. ": " .. message
end
return hs
